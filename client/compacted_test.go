package client_test

import (
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// TestClient_CompactedPushKeepsTheSession: a compacted push (docs/PROTOCOL.md,
// Compacted history) reaches the caller as a KindCompacted delivery, in
// order; the session goes on and the deliveries after it arrive.
func TestClient_CompactedPushKeepsTheSession(t *testing.T) {
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	var cs []*fconn
	for fc := range srv.conns {
		cs = append(cs, fc)
	}
	srv.mu.Unlock()
	for _, fc := range cs {
		if err := fc.wc.WriteMessage(&wire.Compacted{Conversation: 9, Recipient: 0, First: 5}); err != nil {
			t.Fatal(err)
		}
	}
	srv.push(&wire.Delivery{Conversation: 9, Recipient: 0, Seq: 5, Kind: wire.KindRecord, Participant: 1, Payload: []byte{5}})
	if d := next(t, c); d.Kind != client.KindCompacted || d.Conversation != 9 || d.First != 5 {
		t.Fatalf("first delivery after a compacted push = %+v, want KindCompacted of conversation 9, first 5", d)
	}
	if d := next(t, c); d.Conversation != 9 || d.Seq != 5 {
		t.Fatalf("delivery after a compacted push = %+v, want conversation 9 seq 5", d)
	}
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatalf("Ping after a compacted push = %v, want the session alive", err)
	}
}
