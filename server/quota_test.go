package server_test

import (
	"strings"
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

func wantCapacity(t *testing.T, what string, m wire.Message, limit uint64) {
	t.Helper()
	e, ok := m.(*wire.Error)
	if !ok || e.Code != wire.CodeCapacityExceeded || e.Limit == nil || *e.Limit != limit {
		t.Fatalf("%s answered %#v, want capacity_exceeded with limit %d", what, m, limit)
	}
}

// MaxConversations refuses the first enroll of one conversation too many.
func TestQuota_MaxConversations(t *testing.T) {
	h := start(t, server.Config{MaxConversations: 1})
	c := h.dial()
	c.enroll(1)
	wantCapacity(t, "enroll into a second conversation", c.call(&wire.Enroll{ID: c.id(), Conversation: 2, Token: token()}), 1)
	h.dial().enroll(1)
}

// MaxDataBytes is checked against the bytes the store holds: below them
// (a fresh store holds tens of KiB) an enroll is refused, and
// a tell too, while a detach still commits.
func TestQuota_MaxDataBytes(t *testing.T) {
	dir := t.TempDir()
	h := start(t, server.Config{DataDir: dir})
	c := h.dial()
	cr := c.enroll(1)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}

	const limit = 4096
	h = start(t, server.Config{DataDir: dir, MaxDataBytes: limit})
	c = h.dial()
	wantCapacity(t, "enroll past the data cap", c.call(&wire.Enroll{ID: c.id(), Conversation: 1, Token: token()}), limit)
	cr = c.attach(cr)
	wantCapacity(t, "tell past the data cap",
		c.call(&wire.Tell{ID: c.id(), Conversation: 1, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte("x")}), limit)
	if m, ok := c.call(&wire.Detach{ID: c.id(), Conversation: 1, Participant: cr.p, Generation: cr.gen, Token: token()}).(*wire.Detached); !ok {
		t.Fatalf("detach past the data cap answered %#v, want detached", m)
	}
}

// MaxDataBytes caps the bytes the store holds, not its file's size, which
// never shrinks: a conversation whose member does not acknowledge fills
// the store past the cap, and once the member acknowledges everything
// and compaction frees the pages, tells are admitted again. The refusal
// says how the store gets below the cap.
func TestQuota_MaxDataBytesLetsGoOnceCompacted(t *testing.T) {
	const limit = 1 << 20
	cfg := lifecycleConfig()
	cfg.DataDir, cfg.MaxDataBytes = t.TempDir(), limit
	h := start(t, cfg)
	a, b := h.dial(), h.dial()
	ca := a.enroll(1)
	cb := b.enroll(1)
	payload := strings.Repeat("x", 32<<10)
	var last uint64
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("%d tells of %d bytes never reached the %d-byte cap", i, len(payload), limit)
		}
		m := a.call(&wire.Tell{ID: a.id(), Conversation: 1, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte(payload)})
		if told, ok := m.(*wire.Told); ok {
			last = told.Seq
			continue
		}
		wantCapacity(t, "tell past the data cap", m, limit)
		if e := m.(*wire.Error); !strings.Contains(e.Detail, "acknowledged") || !strings.Contains(e.Detail, "raise the limit") {
			t.Errorf("the refusal %q does not say how to get below the cap", e.Detail)
		}
		break
	}
	if m, ok := b.call(&wire.Ack{ID: b.id(), Conversation: 1, Participant: cb.p, Generation: cb.gen, Through: last}).(*wire.Acked); !ok {
		t.Fatalf("ack through %d answered %#v", last, m)
	}
	joined := a.delivery().Seq // b's enrollment
	if m, ok := a.call(&wire.Ack{ID: a.id(), Conversation: 1, Participant: ca.p, Generation: ca.gen, Through: joined}).(*wire.Acked); !ok {
		t.Fatalf("ack through %d answered %#v", joined, m)
	}
	eventually(t, "a tell is admitted below the cap again", func() bool {
		m := a.call(&wire.Tell{ID: a.id(), Conversation: 1, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("again")})
		if _, ok := m.(*wire.Told); ok {
			return true
		}
		wantCapacity(t, "tell while compaction frees the store", m, limit)
		return false
	})
}
