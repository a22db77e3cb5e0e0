package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestCluster_LateUnclaimCannotDeleteAClaimTakenBack: a node lets a deleted
// conversation's claim go, but the delete of its ownership key times out
// and reaches etcd only later; meanwhile a request on the conversation
// makes the node claim it again and find the key still under its lease.
// Taking that key back as it is would hand the late delete a claim to
// remove (it compares the create revision, the same one), leaving a node
// that believes it owns a conversation whose key is gone, which another
// node may claim. The node deletes such a key and claims afresh instead:
// the late delete then compares an old revision and removes nothing.
func TestCluster_LateUnclaimCannotDeleteAClaimTakenBack(t *testing.T) {
	const conv = participant.ConversationID(7)
	pfx := prefix()
	ctx := context.Background()
	cli := newClient(t)
	late := etcdtest.HoldLate(cli.KV)
	cli.KV = late
	a, clk := startDeleting(t, cli, pfx, "a")
	c := a.svc.Connect(nil)
	x, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(9, 1)})
	if err != nil {
		t.Fatal(err)
	}
	leave := participant.Leave{Conversation: conv, Participant: x.Participant, Generation: x.Generation, Secret: x.Secret, Token: tok(9, 2)}
	if _, err := c.Leave(ctx, leave); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	own := pfx + "own/" + conv.String()
	late.ArmDelete(own)
	if got, err := a.svc.CompactPass(ctx); err != nil || got.Deleted != 1 {
		t.Fatalf("CompactPass = %+v, %v; want conversation %v deleted", got, err, conv)
	}
	// The request claims the conversation again and answers retired.
	_, err = c.Leave(ctx, leave)
	if !errors.Is(err, &participant.Error{Code: participant.CodeRetired}) {
		t.Fatalf("the retried leave = %v, want retired", err)
	}
	if late.Apply(t) {
		t.Errorf("the late delete of the released claim removed the claim taken back")
	}
	resp, err := shared.Client.Get(ctx, own)
	if err != nil {
		t.Fatal(err)
	}
	if a.node.Holds(conv) && (len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != a.node.CurrentLease()) {
		t.Fatalf("node a holds conversation %v, but its ownership key is %v", conv, resp.Kvs)
	}
}
