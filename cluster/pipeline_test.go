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

// gate holds the first goroutine that reaches it (hold) until let, and
// tells the test through held that one did.
type gate struct {
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{held: make(chan struct{}), release: make(chan struct{})} }

// hold tells held and waits for let. Only one goroutine may hold.
func (g *gate) hold() {
	close(g.held)
	<-g.release
}

// let releases the held goroutine, or the next one to hold; it may be
// called more than once.
func (g *gate) let() { g.once.Do(func() { close(g.release) }) }

// heldCommit holds, once armed, the n-th next transaction match accepts
// (nil: any that writes, a commit), tells held, waits for let, and then
// ends it with end. Every other call passes through.
type heldCommit struct {
	etcdtest.Trigger
	*gate
	match func(*etcdtest.Txn) bool
	end   func(*etcdtest.Txn) (*clientv3.TxnResponse, error)
}

func newHeldCommit(end func(*etcdtest.Txn) (*clientv3.TxnResponse, error)) *heldCommit {
	return &heldCommit{gate: newGate(), end: end}
}

func (h *heldCommit) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	match := h.match
	if match == nil {
		match = (*etcdtest.Txn).Writes
	}
	if !match(t) || !h.Hit() {
		return t.Send()
	}
	h.hold()
	return h.end(t)
}

// pipelineEnd is one way the held first commit of a pipeline ends.
type pipelineEnd struct {
	name string
	end  func(*etcdtest.Txn) (*clientv3.TxnResponse, error)
	// applied: the held transaction applied; failed: its commit failed
	// (in_doubt answers); fenced: another node took the conversation
	// while it was held.
	applied, failed, fenced bool
}

var pipelineEnds = []pipelineEnd{
	{name: "commits", end: (*etcdtest.Txn).Send, applied: true},
	{name: "refused", end: failWith(etcdtest.Refused), failed: true},
	{name: "unknown outcome, not applied", end: failWith(etcdtest.Lost), failed: true},
	{name: "unknown outcome, applied", end: failWith(etcdtest.LostApplied), applied: true, failed: true},
	{name: "fence taken", end: (*etcdtest.Txn).Send, failed: true, fenced: true},
}

// TestCluster_PipelinedBatches: in cluster mode a batch of tells hands
// the conversation's turn on once its rows are staged, and the next
// batch is decided and staged while the first one's transaction is in
// etcd (participant's pipelined batches; cluster.Node.Pipelines). The
// first tell's commit is held in etcd's client; a second tell, from the
// other participant, is decided on its state and staged behind it, and a
// retry of the first tell is decided behind that, on the first tell's
// row as the store serves it, staged. Then the held transaction:
//   - commits: both tells are answered, in order, the retry replays the
//     first, and each replays again;
//   - is refused, or its outcome is lost (applied or not): the scope
//     fails, so the second tell's writes are never sent; every answer
//     is in_doubt, and a retry of each tell with the same token commits
//     it once (the first replays where its transaction applied), in
//     order;
//   - meets a fence another node took while it was held (the node's
//     lease expired): etcd refuses it; every answer is in_doubt, neither
//     tell is stored, and the node answers moved and holds the
//     conversation no longer.
//
// Before cluster mode pipelined (a node's batch kept the turn until its
// commit returned), the second tell waited for the turn and no batch was
// pipelined: the test fails at its first check.
func TestCluster_PipelinedBatches(t *testing.T) {
	for _, tc := range pipelineEnds {
		t.Run(tc.name, func(t *testing.T) { pipelinedBatches(t, tc, false) })
	}
}

// TestCluster_PipelinedBatchesThroughALaggingMember is
// TestCluster_PipelinedBatches with every serializable read of the node
// reaching a member frozen before the tells (etcdtest.Lagging): the
// retry decided behind the second tell, the replays and the retries
// after a failure read the tokens' index entries, which that member
// holds absent. Each must find what the first batch staged, or what
// committed since: the store serves a staged value itself and pins its
// reads at the scope's revision, which the frozen member refuses as a
// future one (read again linearizably). A read answered by that member
// would decide a committed tell as new and commit it twice.
func TestCluster_PipelinedBatchesThroughALaggingMember(t *testing.T) {
	for _, tc := range pipelineEnds {
		t.Run(tc.name, func(t *testing.T) { pipelinedBatches(t, tc, true) })
	}
}

func pipelinedBatches(t *testing.T, tc pipelineEnd, lagging bool) {
	ctx := context.Background()
	pfx := prefix()
	const conv = 7
	cli := newClient(t)
	var lag *etcdtest.Lagging
	if lagging {
		lag = etcdtest.Lag(cli.KV, conv)
		cli.KV = lag
	}
	h := newHeldCommit(tc.end)
	cli.KV = etcdtest.Hook(cli.KV, etcdtest.Hooks{Txn: h.commit})
	ttl := 5 * time.Second
	if tc.fenced {
		ttl = time.Second
	}
	// The retry of the first tell reads the row the first tell's index
	// entry names, staged: that read of the oplog is the sign that it
	// was decided.
	verified := make(chan struct{})
	verify := &trigger{match: func(step string, c participant.ConversationID) bool { return c == conv && step == "read oplog" },
		f: func() { close(verified) }}
	a := startMemberAt(t, cli, pfx, "a", ttl, participant.Options{}, verify.at)
	t.Cleanup(h.let) // before the member's cleanup, which waits for the tells
	ca, cb, ea, _, tells := enrollTellers(t, a, conv)
	rows := oplogLen(t, a.node, conv)
	if lagging {
		lag.Freeze(currentRev(t), nil)
	}

	h.Arm(1)
	// The first tell, the second, and a retry of the first. A Call runs
	// in the goroutine that waits for it.
	calls := []struct {
		c    *participant.Conn
		tell participant.Tell
	}{{ca, tells[0]}, {cb, tells[1]}, {ca, tells[0]}}
	told := make([]participant.Told, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		if i == 2 {
			verify.armed.Store(true)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			told[i], errs[i] = call.c.Tell(ctx, call.tell)
		}()
		switch i {
		case 0:
			<-h.held
		case 1:
			// The second tell is decided on the first's state and its
			// rows are staged behind the first's, in flight.
			waitUntil(t, "the second tell staged behind the first", func() bool {
				return a.svc.Pipelined() >= 1 && oplogLen(t, a.node, conv) == rows+2
			})
		case 2:
			waitUntil(t, "the retry of the first tell to read the first tell's row", closed(verified))
		}
	}
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
				t.Fatalf("call %d: %v", i+1, err)
			}
		}
		if told[1].Seq != told[0].Seq+1 {
			t.Fatalf("seqs %d and %d, want consecutive", told[0].Seq, told[1].Seq)
		}
		if told[2].Replay == "" || told[2].Seq != told[0].Seq {
			t.Fatalf("the retry of the first tell decided behind the second = %+v, want a replay of seq %d", told[2], told[0].Seq)
		}
		for i, c := range []*participant.Conn{ca, cb} {
			again, err := c.Tell(ctx, tells[i])
			if err != nil || again.Replay == "" || again.Seq != told[i].Seq {
				t.Fatalf("tell %d again = %+v, %v, want a replay of seq %d", i+1, again, err, told[i].Seq)
			}
		}
		checkTells(t, pfx, conv, "one", "two")
		checkLagged(t, lag)
		return
	}
	for i, err := range errs {
		if !errors.Is(err, participant.ErrInDoubt) {
			t.Fatalf("call %d = %+v, %v, want in_doubt", i+1, told[i], err)
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
	if tc.applied {
		checkLagged(t, lag)
	}
}

// checkLagged fails the test when lag, if not nil, refused no read: the
// node's reads of an index entry that committed never met the lagging
// member, and the test proves nothing. (An entry never committed is
// answered absent without a read, by the scope's filter of the names it
// holds.)
func checkLagged(t *testing.T, lag *etcdtest.Lagging) {
	t.Helper()
	if lag != nil && lag.Refused() == 0 {
		t.Fatal("the lagging member refused no read: the test proves nothing")
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

// enrollTellers enrolls two participants of conv on m, over a connection
// each, and returns those connections, their bindings and a tell of
// each, "one" and "two".
func enrollTellers(t *testing.T, m *member, conv participant.ConversationID) (ca, cb *participant.Conn, ea, eb participant.Bound, tells []participant.Tell) {
	t.Helper()
	ctx := context.Background()
	ca, cb = m.svc.Connect(func() {}), m.svc.Connect(func() {})
	var err error
	if ea, err = ca.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)}); err != nil {
		t.Fatal(err)
	}
	if eb, err = cb.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 1)}); err != nil {
		t.Fatal(err)
	}
	tells = []participant.Tell{
		{Conversation: conv, Participant: ea.Participant, Generation: ea.Generation, Token: tok(2, 0), Payload: []byte("one")},
		{Conversation: conv, Participant: eb.Participant, Generation: eb.Generation, Token: tok(2, 1), Payload: []byte("two")},
	}
	return ca, cb, ea, eb, tells
}

// closed returns a condition for waitUntil: ch is closed.
func closed(ch <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
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
