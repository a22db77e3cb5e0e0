package cluster_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/tokenindex"
)

// TestCluster_DeletionSurvivesLeaseLossAtEveryStep: node a's compaction
// pass deletes a conversation every participant left (checkpointed, with
// receipts and a token index), and a loses its lease at step i of that
// pass (every store call, and before and after each Acquire and Flush),
// for every i: the Delete row's commit, the purge's token-index scan, its
// deletions and trims, the Disown. a then stops; node b loads the
// conversation with a retried leave (answered as the leave was, or
// retired), runs its own pass, and must find it deleted and purged: its
// oplog and outbox at their last rows, no checkpoint, no token-index key
// left in etcd, and the retried leave answered retired.
func TestCluster_DeletionSurvivesLeaseLossAtEveryStep(t *testing.T) {
	const conv = participant.ConversationID(5)
	ctx := context.Background()
	stride := 1
	if testing.Short() {
		stride = 3
	}
	var steps int
	for target := 0; ; target += stride {
		pfx := prefix()
		var armed, fired atomic.Bool
		var seen atomic.Int64
		var firedAt atomic.Pointer[string]
		var a *lossNode
		a = startLossNode(t, pfx, "a", func(step string, _ participant.ConversationID) {
			if !armed.Load() || seen.Add(1)-1 != int64(target) || !fired.CompareAndSwap(false, true) {
				return
			}
			firedAt.Store(&step)
			if err := a.node.LoseLease(ctx); err != nil {
				t.Errorf("step %d (%s): LoseLease: %v", target, step, err)
			}
		})
		var leaves []participant.Leave
		var conns []*participant.Conn
		for i := range 2 {
			ca := a.svc.Connect(nil)
			conns = append(conns, ca)
			e, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(0x50, i)})
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				tell := participant.Tell{Conversation: conv, Participant: e.Participant, Generation: e.Generation, Token: tok(0x51, 0), Payload: []byte("x")}
				if _, err := ca.Tell(ctx, tell); err != nil {
					t.Fatal(err)
				}
			}
			leaves = append(leaves, participant.Leave{Conversation: conv, Participant: e.Participant, Generation: e.Generation, Secret: e.Secret, Token: tok(0x52, i)})
		}
		// A checkpoint and receipts for the purge to remove.
		if _, err := a.svc.CheckpointPass(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := a.svc.CompactPass(ctx); err != nil {
			t.Fatal(err)
		}
		for i, l := range leaves {
			if _, err := conns[i].Leave(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		armed.Store(true)
		_, passErr := a.svc.CompactPass(ctx)
		armed.Store(false)
		if !fired.Load() {
			steps = int(seen.Load())
			if passErr != nil {
				t.Fatalf("the pass without a fault: %v", passErr)
			}
			break
		}
		at := *firedAt.Load()
		a.svc.Close()
		a.node.Close() // revokes the lease: b may claim at once

		b := startLossNode(t, pfx, "b", nil)
		if _, err := b.svc.Connect(nil).Leave(ctx, leaves[0]); err != nil && !errors.Is(err, &participant.Error{Code: participant.CodeRetired}) {
			t.Fatalf("lease lost at step %d (%s): the retried leave on b = %v, want its answer or retired", target, at, err)
		}
		if _, err := b.svc.CompactPass(ctx); err != nil {
			t.Fatalf("lease lost at step %d (%s): b's pass: %v", target, at, err)
		}
		if _, err := b.svc.Connect(nil).Leave(ctx, leaves[1]); !errors.Is(err, &participant.Error{Code: participant.CodeRetired}) {
			t.Fatalf("lease lost at step %d (%s): after b's pass the retried leave = %v, want retired", target, at, err)
		}
		view := cluster.OpenView(shared.Client.KV, pfx)
		participanttest.CheckPurged(t, view, conv)
		view.Close()
		tokens, err := shared.Client.Get(ctx, pfx+"d/c/"+conv.String()+"/v/"+tokenindex.ConversationPrefix(conv), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || tokens.Count != 0 {
			t.Fatalf("lease lost at step %d (%s): %d token-index keys left (%v), want none", target, at, tokens.Count, err)
		}
	}
	if steps < 10 {
		t.Fatalf("the deletion pass took %d steps: it should take more", steps)
	}
	t.Logf("lease lost at every %d of the pass's %d steps", stride, steps)
}
