package server_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// Under --max-unacked-age a participant that never acknowledges pins
// nothing: its records are released once older than the bound, and when
// it attaches again its first push is compacted{first}, then the records
// that follow; an ack below first is refused compacted. The metrics count
// the released records and the notice.
func TestMaxUnackedAge_DeafParticipantGetsCompacted(t *testing.T) {
	cfg := lifecycleConfig()
	cfg.MaxUnackedAge = 50 * time.Millisecond
	h := start(t, cfg)
	a, deaf := h.dial(), h.dial()
	ca := a.enroll(1)
	cd := deaf.enroll(1)
	if m, ok := deaf.call(&wire.Detach{ID: deaf.id(), Conversation: 1, Participant: cd.p, Generation: cd.gen, Token: token()}).(*wire.Detached); !ok {
		t.Fatalf("detach answered %#v", m)
	}
	// a acknowledges the deaf one's joining and detaching, so that only
	// the deaf one lost records.
	a.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindDetached })
	if m, ok := a.call(&wire.Ack{ID: a.id(), Conversation: 1, Participant: ca.p, Generation: ca.gen, Through: 3}).(*wire.Acked); !ok {
		t.Fatalf("a's ack answered %#v", m)
	}
	var last uint64
	for _, p := range []string{"one", "two", "three"} {
		last = a.tell(ca, p).Seq
	}
	eventually(t, server.MetricRecordsReleased+" >= 3", func() bool {
		v, _ := h.lookup(server.MetricRecordsReleased)
		return v >= 3
	})

	again := h.dial()
	again.send(&wire.Attach{ID: again.id(), Conversation: 1, Participant: cd.p, Generation: cd.gen, Secret: cd.secret, Token: token()})
	var notice *wire.Compacted
	var attached *wire.Attached
	for notice == nil || attached == nil {
		switch m := again.next().(type) {
		case *wire.Compacted:
			notice = m
		case *wire.Attached:
			attached = m
		default:
			t.Fatalf("attach of the deaf participant: got %#v", m)
		}
	}
	if notice.Conversation != 1 || notice.Recipient != cd.p || notice.First != last+1 {
		t.Fatalf("compacted = %+v, want conversation 1, recipient %d, first %d", notice, cd.p, last+1)
	}
	gen := attached.Generation
	m := again.call(&wire.Ack{ID: again.id(), Conversation: 1, Participant: cd.p, Generation: gen, Through: last})
	if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeCompacted || e.First == nil || *e.First != notice.First {
		t.Fatalf("ack of a released record answered %#v, want compacted with first %d", m, notice.First)
	}
	after := a.tell(ca, "after").Seq
	if d := again.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindRecord }); d.Seq != after || string(d.Payload) != "after" {
		t.Fatalf("the record after the notice = %+v, want seq %d", d, after)
	}
	if v, _ := h.lookup(server.MetricCompactedNotices); v < 1 {
		t.Errorf("%s = %v, want at least 1", server.MetricCompactedNotices, v)
	}
}
