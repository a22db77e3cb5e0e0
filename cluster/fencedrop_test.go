package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
)

// TestCluster_AClaimFoundFencedIsDroppedAndForgotten: a paused node's
// lease expires and another node claims its conversation; the first node
// wakes and its checkpoint pass commits the conversation, a commit etcd
// refuses on the fence (no batch fails, so nothing reloads it). From
// that refusal on the node no longer holds the conversation: it pushes
// nothing more of it, counts it no longer owned, and has forgotten what
// it held of it, as when its lease is lost; the next request is answered
// moved. Before, the node held the claim it knew gone until the next
// request acquired the conversation: it pushed deliveries to a binding
// the new owner had ended, and then, answering moved, kept the
// conversation's state loaded.
func TestCluster_AClaimFoundFencedIsDroppedAndForgotten(t *testing.T) {
	pfx := prefix()
	a := startMemberWith(t, pfx, "a", time.Second, participant.Options{CheckpointRows: 1})
	b := startMember(t, pfx, "b", 5*time.Second)
	ctx := context.Background()
	const conv = 3
	reader, writer := a.svc.Connect(func() {}), a.svc.Connect(func() {})
	rb, err := reader.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil {
		t.Fatal(err)
	}
	wb, err := writer.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Tell(ctx, participant.Tell{Conversation: conv, Participant: wb.Participant, Generation: wb.Generation, Token: tok(1, 2), Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	a.node.PauseKeepAlive()
	waitDeleted(t, pfx+"own/3")
	cb := b.svc.Connect(func() {})
	if _, err := cb.Attach(ctx, participant.Attach{Conversation: conv, Participant: rb.Participant,
		Generation: rb.Generation, Secret: rb.Secret, Token: tok(2, 0)}); err != nil {
		t.Fatalf("Attach on b after a's lease expired: %v", err)
	}

	// a wakes: its checkpoint pass commits the conversation, and etcd
	// refuses the commit on the fence.
	if _, err := a.svc.CheckpointPass(ctx); err != nil {
		t.Logf("a's checkpoint pass: %v", err)
	}
	if a.node.Holds(conv) {
		t.Error("a holds the conversation after etcd refused its commit on the fence")
	}
	if d, ok := reader.Next(conv); ok {
		t.Errorf("a pushed %+v after etcd refused its commit on the fence", d)
	}
	if s := a.node.Stats(); s.Owned != 0 {
		t.Errorf("a owns %d conversations after etcd refused its commit on the fence, want 0", s.Owned)
	}
	if s := a.svc.Stats(); s.Loaded != 0 {
		t.Errorf("a has %d conversations loaded after etcd refused its commit on the fence, want 0", s.Loaded)
	}
	_, err = writer.Tell(ctx, participant.Tell{Conversation: conv, Participant: wb.Participant, Generation: wb.Generation, Token: tok(1, 3), Payload: []byte("y")})
	if !errors.Is(err, participant.ErrMoved) {
		t.Fatalf("Tell on a after the refusal = %v, want moved", err)
	}
	if s := a.svc.Stats(); s.Loaded != 0 {
		t.Errorf("a has %d conversations loaded after answering moved, want 0", s.Loaded)
	}
	if err := a.svc.Failed(); err != nil {
		t.Fatalf("a's service failed: %v", err)
	}
}
