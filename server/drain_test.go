package server_test

import (
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// TestDrain_ByeAndDetachedShutdown drains a server with two bound
// participants: both connections get bye{shutdown} and close, Run returns
// nil, and after a restart on the same data the survivor, re-attaching,
// is delivered the other's detached/shutdown (not a died/unclean_restart).
func TestDrain_ByeAndDetachedShutdown(t *testing.T) {
	dir := t.TempDir()
	h := start(t, server.Config{DataDir: dir})
	const conv = 11
	a, b := h.dial(), h.dial()
	ca := a.enroll(conv)
	cb := b.enroll(conv)
	a.delivery() // B joined
	if err := h.shutdown(); err != nil {
		t.Fatalf("Run after the drain = %v", err)
	}
	for _, c := range []*client{a, b} {
		m := c.next()
		if bye, ok := m.(*wire.ServerBye); !ok || bye.Reason != wire.ByeShutdown {
			t.Fatalf("got %#v, want bye shutdown", m)
		}
		c.expectClosed()
	}

	h2 := start(t, server.Config{DataDir: dir})
	a2 := h2.dial()
	if a2.Welcome.Incarnation != 2 {
		t.Errorf("incarnation after restart = %d, want 2", a2.Welcome.Incarnation)
	}
	a2.attach(ca)
	d := a2.deliveryWhere(func(d *wire.Delivery) bool { return d.Participant == cb.p && d.Seq > 2 })
	if d.Kind != wire.KindDetached || d.Cause == nil || *d.Cause != wire.CauseShutdown {
		t.Fatalf("after restart A got %+v for B, want detached/shutdown", d)
	}
}

func TestDrain_ClientByeEndsClean(t *testing.T) {
	h := start(t, server.Config{})
	a, b := h.dial(), h.dial()
	a.enroll(12)
	cb := b.enroll(12)
	a.delivery()
	b.send(&wire.Bye{ID: b.id()})
	b.expectClosed()
	d := a.delivery()
	if d.Participant != cb.p || d.Kind != wire.KindDetached || d.Cause == nil || *d.Cause != wire.CauseClean {
		t.Fatalf("after B's bye A got %+v, want detached/clean", d)
	}
}
