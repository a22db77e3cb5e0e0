package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
)

// TestCluster_RetryOfACommittedOperationReadsThroughALaggingMember: a
// node's attach and tell commit, their answers are lost, and the clients
// resend them while every serializable read of the node reaches a member
// frozen before those commits. Each retry must replay its commit: the
// node is the conversation's only writer, so it must never read the
// tokens' index entries older than what it committed (decided as new, an
// attach would be refused stale_authority and the Go client would lose the
// participant; a tell would be refused no_binding, or fail its commit's
// compare and answer in_doubt).
func TestCluster_RetryOfACommittedOperationReadsThroughALaggingMember(t *testing.T) {
	const conv = participant.ConversationID(43)
	cli, lag, err := shared.LaggingClient(43)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	a := startMemberOn(t, cli, prefix(), "a", 5*time.Second, participant.Options{})
	ctx := context.Background()
	revision := func() int64 {
		t.Helper()
		resp, err := shared.Client.Get(ctx, "revision")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	c1, c2 := a.svc.Connect(func() {}), a.svc.Connect(func() {})
	b, err := c1.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(0x43, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Detach(ctx, participant.Detach{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Token: tok(0x43, 2)}); err != nil {
		t.Fatal(err)
	}

	before := revision()
	att := participant.Attach{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: tok(0x43, 3)}
	bound, err := c2.Attach(ctx, att)
	if err != nil {
		t.Fatal(err)
	}
	lag.Freeze(before, nil)
	again, err := c2.Attach(ctx, att)
	if err != nil || again.Generation != bound.Generation || again.Replay == participant.ReplayNone {
		t.Fatalf("retry of a committed attach through a lagging member = %+v, %v, want a replay of generation %v", again, err, bound.Generation)
	}

	lag.Thaw()
	before = revision()
	tell := participant.Tell{Conversation: conv, Participant: bound.Participant, Generation: bound.Generation, Token: tok(0x43, 4), Payload: []byte("once")}
	told, err := c2.Tell(ctx, tell)
	if err != nil {
		t.Fatal(err)
	}
	lag.Freeze(before, nil)
	retold, err := c2.Tell(ctx, tell)
	if err != nil || retold.Seq != told.Seq {
		t.Fatalf("retry of a committed tell through a lagging member = %+v, %v, want a replay of seq %v", retold, err, told.Seq)
	}
	if lag.Refused() == 0 {
		t.Fatal("the lagging member refused no read: the test proves nothing")
	}
}
