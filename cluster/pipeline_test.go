package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// heldCommit holds, once armed, the next transaction that writes (a
// commit), tells held, waits for release, and then ends it with end.
// Every other call passes through.
type heldCommit struct {
	etcdtest.Trigger
	held    chan struct{}
	release chan struct{}
	once    sync.Once
	end     func(*etcdtest.Txn) (*clientv3.TxnResponse, error)
}

// let releases the held transaction; it may be called more than once.
func (h *heldCommit) let() { h.once.Do(func() { close(h.release) }) }

func (h *heldCommit) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	if !t.Writes() || !h.Hit() {
		return t.Send()
	}
	close(h.held)
	<-h.release
	return h.end(t)
}

// TestCluster_PipelinedBatches: in cluster mode a batch of tells hands
// the conversation's turn on once its rows are staged, and the next
// batch is decided and staged while the first one's transaction is in
// etcd (participant's pipelined batches; cluster.Node.Pipelines). The
// first tell's commit is held in etcd's client; a second tell, from the
// other participant, is decided on its state and staged behind it. Then
// the held transaction:
//   - commits: both tells are answered, in order, each replays;
//   - is refused, or its outcome is lost (applied or not): the scope
//     fails, so the second tell's writes are never sent; both tells are
//     in_doubt, and a retry of each with the same token commits it once
//     (the first replays where its transaction applied), in order;
//   - meets a fence another node took while it was held (the node's
//     lease expired): etcd refuses it; both tells are in_doubt, neither
//     is stored, and the node answers moved and holds the conversation
//     no longer.
//
// Before cluster mode pipelined (a node's batch kept the turn until its
// commit returned), the second tell waited for the turn and no batch was
// pipelined: the test fails at its first check.
func TestCluster_PipelinedBatches(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(*etcdtest.Txn) (*clientv3.TxnResponse, error)
		// applied: the held transaction applied; failed: its commit
		// failed (in_doubt answers).
		applied, failed, fenced bool
	}{
		{name: "commits", end: (*etcdtest.Txn).Send, applied: true},
		{name: "refused", end: failWith(etcdtest.Refused), failed: true},
		{name: "unknown outcome, not applied", end: failWith(etcdtest.Lost), failed: true},
		{name: "unknown outcome, applied", end: failWith(etcdtest.LostApplied), applied: true, failed: true},
		{name: "fence taken", end: (*etcdtest.Txn).Send, failed: true, fenced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pfx := prefix()
			const conv = 7
			cli := newClient(t)
			h := &heldCommit{held: make(chan struct{}), release: make(chan struct{}), end: tc.end}
			cli.KV = etcdtest.Hook(cli.KV, etcdtest.Hooks{Txn: h.commit})
			ttl := 5 * time.Second
			if tc.fenced {
				ttl = time.Second
			}
			a := startMemberOn(t, cli, pfx, "a", ttl, participant.Options{})
			t.Cleanup(h.let) // before the member's cleanup, which waits for the tells
			ca, cb := a.svc.Connect(func() {}), a.svc.Connect(func() {})
			ea, err := ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
			if err != nil {
				t.Fatal(err)
			}
			eb, err := cb.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)})
			if err != nil {
				t.Fatal(err)
			}
			tells := []participant.Tell{
				{Conversation: conv, Participant: ea.Participant, Generation: ea.Generation, Token: tok(2, 0), Payload: []byte("one")},
				{Conversation: conv, Participant: eb.Participant, Generation: eb.Generation, Token: tok(2, 1), Payload: []byte("two")},
			}
			rows := oplogLen(t, a.node, conv)

			h.Arm(1)
			// A Call runs in the goroutine that waits for it.
			told := make([]participant.Told, 2)
			var errs [2]error
			var wg sync.WaitGroup
			for i, c := range []*participant.Conn{ca, cb} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					told[i], errs[i] = c.Tell(ctx, tells[i])
				}()
				if i == 0 {
					<-h.held
				}
			}
			// The second tell is decided on the first's state and its
			// rows are staged behind the first's, in flight.
			waitUntil(t, "the second tell staged behind the first", func() bool {
				return a.svc.Pipelined() >= 1 && oplogLen(t, a.node, conv) == rows+2
			})
			if tc.fenced {
				// a's lease expires while the commit is held, and b
				// claims the conversation.
				a.node.PauseKeepAlive()
				waitDeleted(t, pfx+"own/"+fmt.Sprint(conv))
				b := startMember(t, pfx, "b", 5*time.Second)
				if _, err := b.svc.Connect(func() {}).Attach(ctx, participant.Attach{Conversation: conv, Participant: ea.Participant,
					Generation: ea.Generation, Secret: ea.Secret, Token: tok(3, 0)}); err != nil {
					t.Fatalf("Attach on b after a's lease expired: %v", err)
				}
			}
			h.let()
			wg.Wait()

			if !tc.failed {
				for i, err := range errs {
					if err != nil {
						t.Fatalf("tell %d: %v", i+1, err)
					}
				}
				if told[1].Seq != told[0].Seq+1 {
					t.Fatalf("seqs %d and %d, want consecutive", told[0].Seq, told[1].Seq)
				}
				for i, c := range []*participant.Conn{ca, cb} {
					again, err := c.Tell(ctx, tells[i])
					if err != nil || again.Replay == "" || again.Seq != told[i].Seq {
						t.Fatalf("tell %d again = %+v, %v, want a replay of seq %d", i+1, again, err, told[i].Seq)
					}
				}
				checkTells(t, pfx, conv, "one", "two")
				return
			}
			for i, err := range errs {
				if !errors.Is(err, participant.ErrInDoubt) {
					t.Fatalf("tell %d = %+v, %v, want in_doubt", i+1, told[i], err)
				}
			}
			if tc.fenced {
				if a.node.Holds(conv) {
					t.Error("a holds the conversation after etcd refused its commit on the fence")
				}
				if _, err := ca.Tell(ctx, tells[0]); !errors.Is(err, participant.ErrMoved) {
					t.Fatalf("the first tell again on a = %v, want moved", err)
				}
				checkTells(t, pfx, conv)
				if err := a.svc.Failed(); err != nil {
					t.Fatalf("a's service failed: %v", err)
				}
				return
			}
			for i, c := range []*participant.Conn{ca, cb} {
				again, err := c.Tell(ctx, tells[i])
				if err != nil {
					t.Fatalf("tell %d again: %v", i+1, err)
				}
				if replayed := again.Replay != ""; replayed != (i == 0 && tc.applied) {
					t.Fatalf("tell %d again = %+v: replayed %v, want %v", i+1, again, replayed, i == 0 && tc.applied)
				}
				told[i] = again
			}
			if told[1].Seq != told[0].Seq+1 {
				t.Fatalf("after the retries, seqs %d and %d, want consecutive", told[0].Seq, told[1].Seq)
			}
			checkTells(t, pfx, conv, "one", "two")
		})
	}
}

func failWith(f etcdtest.Fault) func(*etcdtest.Txn) (*clientv3.TxnResponse, error) {
	return func(t *etcdtest.Txn) (*clientv3.TxnResponse, error) { return t.Fail(f) }
}

// oplogLen returns the length of conv's oplog as the node's store knows
// it, staged rows included.
func oplogLen(t *testing.T, n *cluster.Node, conv participant.ConversationID) uint64 {
	t.Helper()
	l, err := n.Store().Len(oplog.Stream(conv))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitUntil polls cond until it holds, for at most 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// checkTells checks that the tells etcd holds in conv's oplog, under a
// node's data prefix pfx+"d/", carry want, in order, each once.
func checkTells(t *testing.T, pfx string, conv participant.ConversationID, want ...string) {
	t.Helper()
	var got []string
	for _, r := range oplogRows(t, pfx+"d/", conv) {
		if r.Kind == oplog.KindTell {
			got = append(got, string(r.Payload))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("etcd holds tells %q of conversation %d, want %q", got, conv, want)
	}
}
