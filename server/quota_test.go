package server_test

import (
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

// MaxDataBytes is checked against the store file's size on disk: below
// it (the file of a fresh store is tens of KiB) an enroll is refused, and
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
