package cluster_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// The "ownership lost anywhere" fault model. A node's ownership of its
// conversations can end at any instant: its lease expires while it is
// stalled, partitioned or suspended, or etcd forgets it. TestOwnershipLoss
// numbers every step of a workload on node a (every store operation, and
// every call into the ownership seam, participant.Ownership: before and
// after each Acquire and each Flush, which are a batch's barriers and a
// pass's) and, run after run, injects one fault at step i = 0, 1, 2, ...
// (a sample of them from a random offset, plus every seam step, unless
// -ownloss.full), its kind
// drawn from a seeded schedule:
//
//	kind          what happens at the step
//	loss          a loses its lease: every conversation dropped and forgotten (as its keep-alive does)
//	stolen        loss, then node b claims the conversations, commits, checkpoints, compacts, releases
//	stolen-back   stolen, then a claims them back at once, concurrently with the interrupted step
//	stall         a's lease passes its local deadline on both clocks, before the keep-alive notices
//	suspend       the same on the boot clock alone (a suspended VM: the monotonic clock stood still)
//
// The interrupted step then goes on, as the code after it would. After
// each run a third node takes every conversation over and checks the
// contract: no panic (a batch that outlived its conversation's
// forgetting), nothing unloadable (a checkpoint older than the rows left),
// records without gap or duplicate, every answered operation replays its
// answer; and, at a lapse, that a pushes nothing of a conversation from
// the instant its lease's local deadline passed.
var (
	ownlossFull = flag.Bool("ownloss.full", false, "TestOwnershipLoss injects a fault at every step instead of a sample")
	ownlossSeed = flag.Uint64("ownloss.seed", 0, "schedule seed of TestOwnershipLoss; 0 picks one from the clock")
)

// lossKind is the kind of fault injected at a step.
type lossKind int

const (
	lossOnly lossKind = iota
	lossStolen
	lossStolenBack
	lapseStall
	lapseSuspend
)

func (k lossKind) String() string {
	return [...]string{"loss", "stolen", "stolen-back", "stall", "suspend"}[k]
}

// drawKind draws a fault kind. A loss that another node exploits before
// a takes the conversation back finds the most, and is drawn most.
func drawKind(rng *rand.Rand) lossKind {
	switch x := rng.IntN(20); {
	case x < 2:
		return lossOnly
	case x < 6:
		return lossStolen
	case x < 14:
		return lossStolenBack
	case x < 17:
		return lapseStall
	default:
		return lapseSuspend
	}
}

// testClock is a cluster.Clock that a test stalls or suspends.
type testClock struct {
	start      time.Time
	mono, boot atomic.Int64
}

func newTestClock() *testClock { return &testClock{start: time.Now()} }

func (c *testClock) Monotonic() time.Duration {
	return time.Since(c.start) + time.Duration(c.mono.Load())
}

func (c *testClock) Boot() time.Duration { return time.Since(c.start) + time.Duration(c.boot.Load()) }

// Suspend models a machine suspended for d: the boot clock counted it,
// the monotonic clock did not.
func (c *testClock) Suspend(d time.Duration) { c.boot.Add(int64(d)) }

// Stall models a process that did not run for d: both clocks counted it.
func (c *testClock) Stall(d time.Duration) {
	c.mono.Add(int64(d))
	c.boot.Add(int64(d))
}

// hookedOwnership is a node as the service's Ownership, calling at
// before and after each Acquire and Flush.
type hookedOwnership struct {
	*cluster.Node
	at func(step string, c participant.ConversationID)
}

func (h hookedOwnership) Acquire(ctx context.Context, c participant.ConversationID) (bool, error) {
	h.at("acquire", c)
	fresh, err := h.Node.Acquire(ctx, c)
	h.at("acquired", c)
	return fresh, err
}

func (h hookedOwnership) Flush(c participant.ConversationID) error {
	h.at("flush", c)
	err := h.Node.Flush(c)
	h.at("flushed", c)
	return err
}

// hooked returns n's store, wrapped in a faultstore, and n as the
// service's Ownership; with at, both call it: the store after each op,
// with the op and the kind of key it is on ("read token", "append
// oplog"), and the Ownership before and after each Acquire and Flush
// (hookedOwnership).
func hooked(n *cluster.Node, at func(step string, c participant.ConversationID)) (*faultstore.Store, participant.Ownership) {
	st := faultstore.New(n.Store())
	if at == nil {
		return st, n
	}
	st.SetObserver(func(op faultstore.Op, _ faultstore.Action, _ error) {
		c, _ := parseConv(cluster.Scope(op.Name))
		kind, _, _ := strings.Cut(op.Name, "/")
		at(op.Kind.String()+" "+kind, c)
	})
	return st, hookedOwnership{Node: n, at: at}
}

// lossNode is one node of the fault model, its service opened on its
// store wrapped in a faultstore whose observer calls at after each op,
// and with its Ownership hooked likewise.
type lossNode struct {
	node  *cluster.Node
	svc   *participant.Service
	clock *testClock
}

const lossTTL = 2 * time.Second

func startLossNode(t *testing.T, pfx, id string, at func(string, participant.ConversationID)) *lossNode {
	t.Helper()
	ctx := context.Background()
	clk := newTestClock()
	n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: id, Advertise: id + ":7000", Prefix: pfx,
		LeaseTTL: lossTTL, Clock: clk})
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	key, err := n.NodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opts := participant.Options{NodeKey: key, CheckpointRows: 1, Retain: time.Nanosecond}
	st, own := hooked(n, at)
	opts.Ownership = own
	svc, err := participant.Open(ctx, st, opts)
	if err != nil {
		t.Fatalf("participant.Open(%s): %v", id, err)
	}
	n.OnLost(svc.Forget)
	t.Cleanup(func() {
		svc.Close()
		n.Close()
	})
	return &lossNode{node: n, svc: svc, clock: clk}
}

func parseConv(scope string) (participant.ConversationID, bool) {
	var id uint64
	if _, err := fmt.Sscan(scope, &id); err != nil {
		return 0, false
	}
	return participant.ConversationID(id), true
}

// TestOwnershipLoss runs the fault model (see above) over the shared
// etcd. A first run, without a fault, surveys the workload's steps. Then
// each run injects at one target: every sixteenth step from an offset the
// seed picks (every fortieth with -short; every step with -ownloss.full),
// and, whatever the sample, the seam steps (seamSteps), where a loss
// finds a batch or a pass acting on an ownership it no longer holds.
// -ownloss.seed replays a schedule.
func TestOwnershipLoss(t *testing.T) {
	seed := *ownlossSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	stride := uint64(16)
	if *ownlossFull {
		stride = 1
	}
	if testing.Short() {
		stride = 40
	}
	offset := seed % stride
	t.Logf("seed %d, stride %d, offset %d (rerun: go test ./cluster -run TestOwnershipLoss -ownloss.seed %d)", seed, stride, offset, seed)
	m := &lossModel{t: t, seed: seed, pfx: prefix()}
	m.a = startLossNode(t, m.pfx, "a", m.at)
	m.b = startLossNode(t, m.pfx, "b", nil)
	m.c = startLossNode(t, m.pfx, "c", nil)
	survey := m.newRun(0, noFault, 0)
	steps := survey.workload()
	survey.check()
	if t.Failed() {
		t.Fatalf("%s (seed %d)", survey.label(), seed)
	}
	if steps < 5*stride {
		t.Fatalf("the workload took %d steps: it should take far more", steps)
	}
	seams := seamSteps(survey.labels)
	targets := map[uint64]lossKind{}
	for i := offset; i < steps; i += stride {
		targets[i] = drawKind(rand.New(rand.NewPCG(seed, i)))
	}
	for _, i := range seams {
		targets[i] = lossStolenBack
	}
	var lapsesChecked int
	run := 1
	for i := range steps {
		kind, ok := targets[i]
		if !ok {
			continue
		}
		r := m.newRun(run, i, kind)
		run++
		r.workload()
		r.check()
		lapsesChecked += int(r.lapseChecked.Load())
		if t.Failed() {
			t.Fatalf("%s (seed %d)", r.label(), seed)
		}
	}
	t.Logf("%d runs over %d steps (%d seam steps: %v); %d lapses checked a push", run, steps, len(seams), seams, lapsesChecked)
}

// noFault is the target of a run that injects nothing.
const noFault = ^uint64(0)

// seamSteps returns the steps of a fault-free run (labels, one per step)
// where a loss exposes a belief in an ownership the node no longer holds,
// the first occurrence of each kind:
//
//   - the return of each barrier ("flushed"), per kind of write it made
//     durable: a batch past it installs state and answers, a pass trims;
//   - a checkpoint pass's staging: every step from its read of a stored
//     checkpoint to its write of the new one, the window in which another
//     node can checkpoint and compact past what the pass derived.
//
// A loss there, with another node's claim, commit, checkpoint and
// compaction and a reclaim (lossStolenBack), is what a batch or a pass
// must survive; the sample of other steps covers the rest.
func seamSteps(labels []string) []uint64 {
	var out []uint64
	seen := map[string]bool{}
	for i, l := range labels {
		if l == "flushed" && i >= 2 && !seen[labels[i-2]] {
			seen[labels[i-2]] = true
			out = append(out, uint64(i))
		}
	}
	for i, l := range labels {
		if l != "pass: read checkpoint" {
			continue
		}
		for j := i; j < len(labels) && labels[j] != "pass: put_bytes checkpoint"; j++ {
			out = append(out, uint64(j))
		}
		break
	}
	return out
}

// lossModel holds the nodes the runs share: a runs the workload, b steals
// from it, c checks. Each run uses conversations of its own.
type lossModel struct {
	t       *testing.T
	seed    uint64
	pfx     string
	a, b, c *lossNode
	// run is the run in progress, read by the hooks.
	run atomic.Pointer[lossRun]
}

func (m *lossModel) at(step string, c participant.ConversationID) {
	if r := m.run.Load(); r != nil {
		r.at(step, c)
	}
}

// lossRun is one run: the workload with one fault injected at step target.
type lossRun struct {
	m      *lossModel
	t      *testing.T
	ctx    context.Context
	convs  []participant.ConversationID
	target uint64
	kind   lossKind
	steps  atomic.Uint64
	fired  atomic.Bool
	// firedAt names the step the fault was injected at. The fault may
	// fire on any goroutine of a (a background reload among them).
	firedAt atomic.Pointer[string]
	// reclaims are a's claims back that had to wait for the turn the
	// interrupted step holds.
	reclaims sync.WaitGroup
	tokens   atomic.Uint32
	// inCheckpointPass is set while the workload runs a checkpoint pass;
	// labels are the kinds of the steps of a run without a fault, "pass: "
	// prefixed in a checkpoint pass (for seamSteps).
	inCheckpointPass atomic.Bool
	labels           []string

	mu  sync.Mutex
	log []participanttest.Answered
	// creds are the workload's participants (b takes them over).
	// +checklocks:mu
	creds []*cred
	// conns are a's connections, for the push check at a lapse.
	// +checklocks:mu
	conns []*participant.Conn
	// lapseChecked counts lapses injected while a had something to push.
	lapseChecked atomic.Int32
}

// newRun starts run number run, which injects a fault of kind at step
// target (noFault: none).
func (m *lossModel) newRun(run int, target uint64, kind lossKind) *lossRun {
	base := participant.ConversationID(1000 + 10*run)
	r := &lossRun{m: m, t: m.t, ctx: context.Background(), convs: []participant.ConversationID{base + 1, base + 2},
		target: target, kind: kind}
	r.tokens.Store(uint32(run) << 12)
	m.run.Store(r)
	return r
}

func (r *lossRun) label() string {
	if !r.fired.Load() {
		return fmt.Sprintf("run without a fault (%d steps)", r.steps.Load())
	}
	at := "?"
	if p := r.firedAt.Load(); p != nil {
		at = *p
	}
	return fmt.Sprintf("%s at step %d (%s)", r.kind, r.target, at)
}

func (r *lossRun) token() participant.Token {
	n := r.tokens.Add(1)
	var t participant.Token
	t[0], t[1], t[2], t[3] = 0x70, byte(n), byte(n>>8), byte(n>>16)
	return t
}

func (r *lossRun) answered(what string, check func(context.Context, *participant.Conn) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, participanttest.Answered{What: what, Check: func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
		return check(ctx, c)
	}})
}

// at is the hook: the fault fires at step target, once.
func (r *lossRun) at(step string, c participant.ConversationID) {
	i := r.steps.Add(1) - 1
	if r.target == noFault {
		if r.inCheckpointPass.Load() {
			step = "pass: " + step
		}
		r.mu.Lock()
		for uint64(len(r.labels)) <= i {
			r.labels = append(r.labels, "")
		}
		r.labels[i] = step
		r.mu.Unlock()
		return
	}
	if i != r.target || !r.fired.CompareAndSwap(false, true) {
		return
	}
	at := fmt.Sprintf("%s of %v", step, c)
	r.firedAt.Store(&at)
	a := r.m.a
	switch r.kind {
	case lapseStall, lapseSuspend:
		pushable := r.pushable()
		if r.kind == lapseStall {
			a.clock.Stall(2 * lossTTL)
		} else {
			a.clock.Suspend(2 * lossTTL)
		}
		if pushable > 0 {
			r.lapseChecked.Add(1)
		}
		r.mu.Lock()
		conns := r.conns
		r.mu.Unlock()
		for _, cn := range conns {
			for _, b := range cn.Bindings() {
				cn.SetOfferedForTest(b.Conversation, participant.Offered{})
				if d, ok := cn.Next(b.Conversation); ok {
					r.t.Errorf("%s: a pushed %v seq %v to participant %v after its lease's local deadline passed",
						r.label(), b.Conversation, d.Seq, d.Recipient)
				}
			}
		}
		// The keep-alive loses the lease on its next tick; losing it now
		// keeps the run short (whichever comes first does it).
		if err := a.node.LoseLease(r.ctx); err != nil {
			r.t.Errorf("%s: LoseLease: %v", r.label(), err)
		}
		return
	}
	if err := a.node.LoseLease(r.ctx); err != nil {
		r.t.Errorf("%s: LoseLease: %v", r.label(), err)
		return
	}
	if r.kind == lossOnly {
		return
	}
	r.steal()
	if r.kind == lossStolenBack {
		for _, c := range r.convs {
			if release, ok := participanttest.TryTurn(a.svc, c); ok {
				// The interrupted step does not hold c's turn: a claims c
				// back before it goes on.
				release()
				r.touch(a.svc, c)
				continue
			}
			r.reclaims.Add(1)
			go func() {
				defer r.reclaims.Done()
				r.touch(a.svc, c)
			}()
		}
	}
}

// pushable counts the deliveries a's connections would be offered now.
func (r *lossRun) pushable() int {
	r.mu.Lock()
	conns := r.conns
	r.mu.Unlock()
	n := 0
	for _, cn := range conns {
		for _, b := range cn.Bindings() {
			cn.SetOfferedForTest(b.Conversation, participant.Offered{})
			if _, ok := cn.Next(b.Conversation); ok {
				n++
			}
		}
	}
	return n
}

// steal has b take every conversation of the run over: it attaches a's
// participants (ending a's bindings as died/unclean_restart on the way),
// tells, and has everyone acknowledge everything, then checkpoints,
// compacts (past wherever a's checkpoints stand) and releases them.
func (r *lossRun) steal() {
	b := r.m.b
	r.mu.Lock()
	creds := append([]*cred(nil), r.creds...)
	r.mu.Unlock()
	type stolen struct {
		cr   *cred
		conn *participant.Conn
		b    participant.Bound
	}
	var got []stolen
	for _, cr := range creds {
		bd, ok := r.get(cr)
		if !ok {
			continue
		}
		cn := b.svc.Connect(nil)
		req := participant.Attach{Conversation: bd.Conversation, Participant: bd.Participant,
			Generation: bd.Generation, Secret: bd.Secret, Token: r.token()}
		nb, err := cn.Attach(r.ctx, req)
		if err != nil {
			r.t.Logf("%s: b's attach of %v in %v: %v", r.label(), bd.Participant, bd.Conversation, err)
			continue
		}
		r.answered(fmt.Sprintf("b's attach of %v in %v", nb.Participant, nb.Conversation), func(ctx context.Context, cn *participant.Conn) error {
			again, err := cn.Attach(ctx, req)
			return sameBinding(nb, again, err)
		})
		r.set(cr, nb)
		got = append(got, stolen{cr, cn, nb})
	}
	for _, st := range got {
		tell := participant.Tell{Conversation: st.b.Conversation, Participant: st.b.Participant, Generation: st.b.Generation,
			Token: r.token(), Payload: []byte("from b")}
		if told, err := st.conn.Tell(r.ctx, tell); err == nil {
			r.answered(fmt.Sprintf("b's tell in %v", tell.Conversation), tellReplays(tell, told))
		}
	}
	for _, st := range got {
		if last, ok := lastOffered(st.conn, st.b.Conversation); ok {
			_, _ = st.conn.Ack(r.ctx, participant.Ack{Conversation: st.b.Conversation, Participant: st.b.Participant,
				Generation: st.b.Generation, Through: last})
		}
	}
	if _, err := b.svc.CheckpointPass(r.ctx); err != nil {
		r.t.Logf("%s: b's checkpoint pass: %v", r.label(), err)
	}
	if _, err := b.svc.CompactPass(r.ctx); err != nil {
		r.t.Logf("%s: b's compaction pass: %v", r.label(), err)
	}
	if err := b.node.Release(r.ctx); err != nil {
		r.t.Errorf("%s: b's release: %v", r.label(), err)
	}
}

// touch has svc claim and reconcile c, with an attach that is refused
// (no secret) and commits nothing.
func (r *lossRun) touch(svc *participant.Service, c participant.ConversationID) {
	_, _ = svc.Connect(nil).Attach(r.ctx, participant.Attach{Conversation: c, Participant: 0, Generation: 1, Token: r.token()})
}

// cred is a participant the workload holds, on its connection; b and ok
// are guarded by lossRun.mu (a steal takes the participant over).
type cred struct {
	conn *participant.Conn
	b    participant.Bound
	ok   bool
}

func (r *lossRun) get(cr *cred) (participant.Bound, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cr.b, cr.ok
}

func (r *lossRun) set(cr *cred, b participant.Bound) {
	r.mu.Lock()
	cr.b, cr.ok = b, true
	r.mu.Unlock()
}

// workload drives a on the run's conversations: enrolls, tells, acks, a
// superseding attach, checkpoint and compaction passes. An operation the
// fault refused is retried once with its token (so that a retry of a
// commit in doubt is checked too), after an attach when the binding was
// lost. It returns how many steps it took.
func (r *lossRun) workload() uint64 {
	a := r.m.a
	conn := func() *participant.Conn {
		cn := a.svc.Connect(nil)
		r.mu.Lock()
		r.conns = append(r.conns, cn)
		r.mu.Unlock()
		return cn
	}
	c1, c2 := r.convs[0], r.convs[1]
	sender, reader, other := &cred{conn: conn()}, &cred{conn: conn()}, &cred{conn: conn()}
	r.mu.Lock()
	r.creds = []*cred{sender, reader, other}
	r.mu.Unlock()
	r.enroll(sender, c1)
	r.enroll(reader, c1)
	r.enroll(other, c2)
	for k := range 10 {
		r.tell(sender, k)
		r.tell(other, k)
		if k%3 == 2 {
			r.ack(reader)
		}
		if k == 5 {
			// The reader moves to a new connection, superseding its binding.
			reader.conn = conn()
			r.attach(reader)
		}
		if k%4 == 3 {
			r.passes()
		}
	}
	r.passes()
	r.reclaims.Wait()
	r.m.run.Store(nil)
	return r.steps.Load()
}

func (r *lossRun) passes() {
	r.inCheckpointPass.Store(true)
	_, err := r.m.a.svc.CheckpointPass(r.ctx)
	r.inCheckpointPass.Store(false)
	if err != nil {
		r.t.Logf("%s: a's checkpoint pass: %v", r.label(), err)
	}
	if _, err := r.m.a.svc.CompactPass(r.ctx); err != nil {
		r.t.Logf("%s: a's compaction pass: %v", r.label(), err)
	}
}

func (r *lossRun) enroll(cr *cred, c participant.ConversationID) {
	req := participant.Enroll{Conversation: c, Token: r.token()}
	for range 2 {
		bd, err := cr.conn.Enroll(r.ctx, req)
		if err == nil {
			r.set(cr, bd)
			r.answered(fmt.Sprintf("enroll in %v", c), func(ctx context.Context, cn *participant.Conn) error {
				got, err := cn.Enroll(ctx, req)
				return sameBinding(bd, got, err)
			})
			return
		}
	}
}

func (r *lossRun) attach(cr *cred) bool {
	cur, ok := r.get(cr)
	if !ok {
		return false
	}
	req := participant.Attach{Conversation: cur.Conversation, Participant: cur.Participant,
		Generation: cur.Generation, Secret: cur.Secret, Token: r.token()}
	for range 2 {
		bd, err := cr.conn.Attach(r.ctx, req)
		if err == nil {
			r.set(cr, bd)
			r.answered(fmt.Sprintf("attach of %v in %v", bd.Participant, bd.Conversation), func(ctx context.Context, cn *participant.Conn) error {
				got, err := cn.Attach(ctx, req)
				return sameBinding(bd, got, err)
			})
			return true
		}
	}
	return false
}

func (r *lossRun) tell(cr *cred, k int) {
	cur, ok := r.get(cr)
	if !ok {
		return
	}
	req := participant.Tell{Conversation: cur.Conversation, Participant: cur.Participant, Generation: cur.Generation,
		Token: r.token(), Payload: []byte(fmt.Sprintf("tell %d", k))}
	for try := range 2 {
		told, err := cr.conn.Tell(r.ctx, req)
		if err == nil {
			r.answered(fmt.Sprintf("tell %d in %v", k, req.Conversation), tellReplays(req, told))
			return
		}
		if try == 0 && r.attach(cr) {
			cur, _ = r.get(cr)
			req.Generation = cur.Generation
		}
	}
}

// ack acknowledges everything the participant was offered.
func (r *lossRun) ack(cr *cred) {
	cur, ok := r.get(cr)
	if !ok {
		return
	}
	if last, ok := lastOffered(cr.conn, cur.Conversation); ok {
		_, _ = cr.conn.Ack(r.ctx, participant.Ack{Conversation: cur.Conversation, Participant: cur.Participant,
			Generation: cur.Generation, Through: last})
	}
}

// check has c take every conversation of the run over, once a and b gave
// them up, and checks the contract.
func (r *lossRun) check() {
	t, ctx := r.t, r.ctx
	m := r.m
	if err := m.a.node.LoseLease(ctx); err != nil {
		t.Fatalf("%s: a's LoseLease: %v", r.label(), err)
	}
	if err := m.b.node.Release(ctx); err != nil {
		t.Fatalf("%s: b's release: %v", r.label(), err)
	}
	for _, c := range r.convs {
		r.touch(m.c.svc, c)
	}
	for _, u := range m.c.svc.Unloadable() {
		for _, c := range r.convs {
			if u.Conversation == c {
				t.Errorf("%s: conversation %v is unloadable: %s: %s", r.label(), c, u.Class, u.Reason)
			}
		}
	}
	ro := etcdstore.Open(shared.Client, etcdstore.Options{Prefix: m.pfx + "d/", Scope: cluster.Scope})
	defer ro.Close()
	for _, c := range r.convs {
		rows, first, err := participanttest.StoredOutbox(ro, c)
		if err != nil {
			t.Errorf("%s: outbox of %v: %v", r.label(), c, err)
			continue
		}
		participanttest.CheckRecords(prefixedTB{t, r.label() + ": "}, rows, first > 0)
	}
	cn := m.c.svc.Connect(nil)
	for _, a := range r.log {
		if err := a.Check(ctx, cn, nil); err != nil {
			t.Errorf("%s: answered %s: %v", r.label(), a.What, err)
		}
	}
	if err := m.c.node.Release(ctx); err != nil {
		t.Fatalf("%s: c's release: %v", r.label(), err)
	}
	// c forgets what it loaded, so that its memory stays small.
	for _, c := range r.convs {
		m.c.svc.Forget(c)
	}
}

func tellReplays(req participant.Tell, told participant.Told) func(context.Context, *participant.Conn) error {
	return func(ctx context.Context, cn *participant.Conn) error {
		got, err := cn.Tell(ctx, req)
		if err != nil || got.Seq != told.Seq || got.Replay != participant.ReplayCommitted {
			return fmt.Errorf("replay = %+v, %v; want seq %v committed", got, err, told.Seq)
		}
		return nil
	}
}

// sameBinding reports an error unless got replays want (or the receipt
// was superseded by a later attach, which is how a replay of a superseded
// binding is answered).
func sameBinding(want, got participant.Bound, err error) error {
	var pe *participant.Error
	if errors.As(err, &pe) && pe.Code == participant.CodeReceiptExpired && pe.Reason == "superseded" && pe.Generation > want.Generation {
		return nil
	}
	if err != nil {
		return err
	}
	if got.Participant != want.Participant || got.Generation != want.Generation || got.Secret != want.Secret ||
		got.Replay == participant.ReplayNone {
		return fmt.Errorf("replay = %+v, want %+v marked as a replay", got, want)
	}
	return nil
}

// prefixedTB prefixes failure messages with the run they belong to.
type prefixedTB struct {
	*testing.T
	prefix string
}

func (p prefixedTB) Errorf(format string, args ...any) {
	p.T.Helper()
	p.T.Errorf(p.prefix+format, args...)
}

func (p prefixedTB) Fatalf(format string, args ...any) {
	p.T.Helper()
	p.T.Fatalf(p.prefix+format, args...)
}
