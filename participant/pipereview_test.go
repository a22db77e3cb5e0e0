package participant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// Adversarial tests of pipelined batches (pipeline.go): each shows a rule
// of docs/DESIGN.md "Pipelined batches" that a batch decided while the one
// before it is in flight can break.

// pipeRig is a service over faultstore on the memory store (newPipeRig),
// or over a gatedMemory (newGatedRig), either keeping its writes' order
// so that batches pipeline, with two participants of one conversation,
// each on a connection of its own.
type pipeRig struct {
	t  *testing.T
	fs *faultstore.Store
	// gated is the store of a rig from newGatedRig.
	gated  *gatedMemory
	svc    *Service
	ca, cb *Conn
	a, b   Bound
}

const pipeConv ConversationID = 7

func newPipeRig(t *testing.T, opts Options, rules ...faultstore.Rule) *pipeRig {
	t.Helper()
	fs := faultstore.New(store.NewMemory())
	fs.SetRules(rules...)
	opts.NodeKey = testKey
	svc, err := Open(context.Background(), fs, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	r := &pipeRig{t: t, fs: fs, svc: svc}
	t.Cleanup(func() {
		fs.Release() // a test that failed with a flush held
		svc.Close()
	})
	r.enrollBoth()
	return r
}

// enrollBoth connects a and b and enrolls them in pipeConv.
func (r *pipeRig) enrollBoth() {
	r.t.Helper()
	ctx := context.Background()
	r.ca, r.cb = r.svc.Connect(nil), r.svc.Connect(nil)
	var err error
	if r.a, err = r.ca.Enroll(ctx, Enroll{Conversation: pipeConv, Token: token(1)}); err != nil {
		r.t.Fatal(err)
	}
	if r.b, err = r.cb.Enroll(ctx, Enroll{Conversation: pipeConv, Token: token(2)}); err != nil {
		r.t.Fatal(err)
	}
}

// tellOf returns a tell by a (or b) with token n and payload {n}.
func (r *pipeRig) tellOf(byA bool, n byte) (*Conn, Tell) {
	c, p := r.cb, r.b
	if byA {
		c, p = r.ca, r.a
	}
	return c, Tell{Conversation: pipeConv, Participant: p.Participant, Generation: p.Generation, Token: token(n), Payload: []byte{n}}
}

type toldResult struct {
	told Told
	err  error
}

// wait waits for call on a goroutine of its own and returns its outcome's
// channel.
func waitCall(call *Call[Told]) <-chan toldResult {
	out := make(chan toldResult, 1)
	go func() {
		told, err := call.Wait()
		out <- toldResult{told, err}
	}()
	return out
}

// answeredEarly fails the test if ch has an outcome within a while: the
// commit it rests on is held.
func answeredEarly(t *testing.T, what string, ch <-chan toldResult) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s answered while the commit it rests on is not durable: %+v", what, v)
	case <-time.After(100 * time.Millisecond):
	}
}

// A retry of a tell in flight, batched with a new tell whose commit fails
// before its barriers (its token's index entry cannot be written), must
// not be answered before the tell it replays is durable (rule 2): a
// committed replay of a row that a power cut may still take away.
func TestPipeline_ARetryBatchedWithAFailingAppendWaitsForTheTellInFlight(t *testing.T) {
	hang := faultstore.NewSwitch(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang)))
	failCAS := faultstore.NewSwitch(faultstore.OnKind(faultstore.OpCAS, faultstore.Fail))
	r := newPipeRig(t, Options{}, hang, failCAS)
	ctx := context.Background()

	hang.Set(true)
	ca, first := r.tellOf(true, 10)
	firstOut := waitCall(ca.StartTell(ctx, first))
	<-r.fs.Hung() // the first tell's commit is in flight

	// One batch: the retry of the first tell (a replay, decided on its
	// working state) and b's new tell, whose token CAS fails.
	failCAS.Set(true)
	retry := r.ca.StartTell(ctx, first)
	cb, second := r.tellOf(false, 11)
	newCall := cb.StartTell(ctx, second)
	retryOut, newOut := waitCall(retry), waitCall(newCall)
	answeredEarly(t, "the retry", retryOut)

	failCAS.Set(false)
	r.fs.Release()
	f, rt := <-firstOut, <-retryOut
	<-newOut
	if f.err != nil {
		t.Fatalf("first tell: %v", f.err)
	}
	if rt.err == nil && (rt.told.Seq != f.told.Seq || rt.told.Replay != ReplayCommitted) {
		t.Fatalf("retry = %+v, want a replay of seq %v (or an error)", rt.told, f.told.Seq)
	}
}

// As above, and the tell in flight then fails: the retry, decided on its
// row, and the other tell of its batch are in doubt, whatever their own
// failure said.
func TestPipeline_ARetryBatchedWithAFailingAppendSharesTheFailureInFlight(t *testing.T) {
	r, g := newGatedRig(t, Options{})
	ctx := context.Background()
	first := r.holdTell(true)
	cb, second := r.tellOf(false, 11)
	g.failCASOf(tokenRef{p: second.Participant, t: second.Token}.key(pipeConv))
	retry, secondCall := r.ca.StartTell(ctx, first.req), cb.StartTell(ctx, second) // one batch
	retryOut, secondOut := waitCall(retry), waitCall(secondCall)
	answeredEarly(t, "the retry", retryOut)
	close(first.gate.release)
	for _, o := range []toldResult{<-first.out, <-retryOut, <-secondOut} {
		if !inDoubt(o.err) {
			t.Fatalf("outcome = %+v, want in_doubt", o)
		}
	}
}

// gatedMemory is the memory store whose next Flush, once armed, blocks
// until the test lets it go and then fails without flushing anything:
// not sticky, so a later Flush makes every write durable, the armed
// one's too.
type gatedMemory struct {
	*store.Memory
	mu sync.Mutex
	// +checklocks:mu
	armed bool
	// +checklocks:mu
	fail bool
	// bad are keys whose ReadValue reports them damaged; failCAS, keys
	// whose CAS fails (not performed).
	// +checklocks:mu
	bad map[string]bool
	// +checklocks:mu
	failCAS map[string]bool
	// blocked is closed once the armed Flush blocks; release lets it go.
	// +checklocks:mu
	blocked chan struct{}
	// +checklocks:mu
	release chan struct{}
}

// gate is an armed Flush: blocked is closed once it blocks, and closing
// release lets it go.
type gate struct{ blocked, release chan struct{} }

// arm arms the next Flush, to fail with fail, and returns its gate.
func (g *gatedMemory) arm(fail bool) gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.fail = true, fail
	g.blocked, g.release = make(chan struct{}), make(chan struct{})
	return gate{g.blocked, g.release}
}

var errGatedFlush = errors.New("test: gated flush failed")

// damage makes ReadValue of key report it damaged, as a value whose
// checksum fails does.
func (g *gatedMemory) damage(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.bad == nil {
		g.bad = map[string]bool{}
	}
	g.bad[key] = true
}

// failCASOf makes CAS of key fail, not performed.
func (g *gatedMemory) failCASOf(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failCAS == nil {
		g.failCAS = map[string]bool{}
	}
	g.failCAS[key] = true
}

func (g *gatedMemory) CAS(key string, old, new uint64) error {
	g.mu.Lock()
	fail := g.failCAS[key]
	g.mu.Unlock()
	if fail {
		return errGatedFlush
	}
	return g.Memory.CAS(key, old, new)
}

func (g *gatedMemory) ReadValue(key string) (uint64, error) {
	g.mu.Lock()
	bad := g.bad[key]
	g.mu.Unlock()
	if bad {
		return 0, &store.ChecksumError{File: "test", Key: key, What: "checksum 00000000 stored, 00000001 computed"}
	}
	return g.Memory.ReadValue(key)
}

func (g *gatedMemory) Flush() error {
	g.mu.Lock()
	armed, fail := g.armed, g.fail
	g.armed = false
	blocked, release := g.blocked, g.release
	g.mu.Unlock()
	if armed {
		close(blocked)
		<-release
		if fail {
			return errGatedFlush
		}
	}
	return g.Memory.Flush()
}

// newGatedRig is newPipeRig over a gatedMemory.
func newGatedRig(t *testing.T, opts Options) (*pipeRig, *gatedMemory) {
	t.Helper()
	g := &gatedMemory{Memory: store.NewMemory()}
	opts.NodeKey = testKey
	svc, err := Open(context.Background(), g, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	r := &pipeRig{t: t, gated: g, svc: svc}
	t.Cleanup(func() {
		g.mu.Lock()
		if g.release != nil {
			select {
			case <-g.release:
			default:
				close(g.release)
			}
		}
		g.mu.Unlock()
		svc.Close()
	})
	r.enrollBoth()
	return r, g
}

// heldTell is a tell whose commit is in flight: its flush blocks until
// the test closes gate.release.
type heldTell struct {
	gate gate
	req  Tell
	out  <-chan toldResult
}

// holdTell arms the gated store's next flush, to fail with fail, starts
// a's tell with token 10 and returns once that tell's flush blocks.
func (r *pipeRig) holdTell(fail bool) heldTell {
	r.t.Helper()
	gt := r.gated.arm(fail)
	c, req := r.tellOf(true, 10)
	out := waitCall(c.StartTell(context.Background(), req))
	<-gt.blocked
	return heldTell{gate: gt, req: req, out: out}
}

// pipelineTell holds a's tell with token 10 (holdTell), starts b's with
// token 11, and returns once b's batch was decided on the state of a's,
// in flight: both tells' outcomes, and the gate that holds a's flush.
func (r *pipeRig) pipelineTell(fail bool) (firstOut, secondOut <-chan toldResult, gt gate) {
	r.t.Helper()
	first := r.holdTell(fail)
	c, second := r.tellOf(false, 11)
	secondOut = waitCall(c.StartTell(context.Background(), second))
	r.waitPipelined(1)
	return first.out, secondOut, first.gate
}

// waitPipelined waits until n batches were decided while the one before
// them was in flight.
func (r *pipeRig) waitPipelined(n uint64) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.svc.Pipelined() < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("Pipelined = %d, want %d", r.svc.Pipelined(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitDequeued waits until a batch took every operation queued on the
// conversation: they are being decided, or wait for the batch in flight.
func (r *pipeRig) waitDequeued() {
	r.t.Helper()
	cv := r.svc.existing(pipeConv)
	deadline := time.Now().Add(10 * time.Second)
	for {
		cv.qmu.Lock()
		n := len(cv.queue)
		cv.qmu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%d operations still queued", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func inDoubt(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.Code == CodeInDoubt
}

// When the commit in flight fails and the store's failure is not sticky,
// the next batch's flush makes both batches' rows durable: both are in
// doubt, and once the conversation is reloaded every retry replays its
// tell, once, and the receiver is offered each record once.
func TestPipeline_AFailedFlushThatIsNotStickyLeavesBothInDoubtThenReplays(t *testing.T) {
	for _, withRetry := range []bool{false, true} {
		name := "new tell"
		if withRetry {
			name = "retry of the tell in flight and a new tell"
		}
		t.Run(name, func(t *testing.T) {
			r, g := newGatedRig(t, Options{})
			ctx := context.Background()
			held := r.holdTell(true)
			first, firstOut := held.req, held.out
			// Both queued before either is waited for: one batch.
			var retry *Call[Told]
			if withRetry {
				retry = r.ca.StartTell(ctx, first)
			}
			cb, second := r.tellOf(false, 11)
			secondCall := cb.StartTell(ctx, second)
			var retryOut <-chan toldResult
			if withRetry {
				retryOut = waitCall(retry)
			}
			secondOut := waitCall(secondCall)
			r.waitPipelined(1)
			answeredEarly(t, "the second tell", secondOut)
			close(held.gate.release)
			if f := <-firstOut; !inDoubt(f.err) {
				t.Fatalf("first tell = %+v, want in_doubt", f)
			}
			if s := <-secondOut; !inDoubt(s.err) {
				t.Fatalf("second tell = %+v, want in_doubt: decided on a failed commit", s)
			}
			if withRetry {
				if rt := <-retryOut; !inDoubt(rt.err) {
					t.Fatalf("retry = %+v, want in_doubt: it replays a failed commit", rt)
				}
			}
			r.svc.waitReloads()
			seqs := map[Seq]byte{}
			for _, c := range []struct {
				conn *Conn
				req  Tell
			}{{r.ca, first}, {r.cb, second}} {
				told, err := c.conn.Tell(ctx, c.req)
				if err != nil {
					t.Fatalf("retry of tell %d: %v", c.req.Token[0], err)
				}
				again, err := c.conn.Tell(ctx, c.req)
				if err != nil || again.Seq != told.Seq || again.Replay != ReplayCommitted {
					t.Fatalf("second retry of tell %d = %+v, %v; want seq %v replayed", c.req.Token[0], again, err, told.Seq)
				}
				if other, ok := seqs[told.Seq]; ok {
					t.Fatalf("tells %d and %d both at seq %v", other, c.req.Token[0], told.Seq)
				}
				seqs[told.Seq] = c.req.Token[0]
			}
			if n := oplogLen(t, g, pipeConv); n != 5 {
				t.Fatalf("oplog rows = %d, want 5: genesis, two enrollments, two tells, each once", n)
			}
			// Each receiver is offered the other's record once.
			for _, c := range []*Conn{r.ca, r.cb} {
				got := map[Seq]int{}
				for _, d := range drainNext(c, pipeConv) {
					got[d.Seq]++
				}
				for q, n := range got {
					if n != 1 {
						t.Fatalf("record %v offered %d times", q, n)
					}
				}
			}
		})
	}
}

// The backlog bounds hold with a batch in flight (rule 7): the batch
// decided on its working state counts the records it adds, so that the
// same tells are refused as when each batch keeps its turn.
func TestPipeline_TheBacklogBoundsCountTheBatchInFlight(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"conversation", Options{MaxBacklogRecords: 3}},
		{"server", Options{BacklogRecords: 3, ClientShare: 100}},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := func(noPipeline bool) (refused int, records int64) {
				opts := c.opts
				opts.NoPipeline = noPipeline
				r, _ := newGatedRig(t, opts)
				ctx := context.Background()
				first := r.holdTell(false)
				_, second := r.tellOf(true, 11)
				_, third := r.tellOf(true, 12)
				secondCall, thirdCall := r.ca.StartTell(ctx, second), r.ca.StartTell(ctx, third)
				secondOut, thirdOut := waitCall(secondCall), waitCall(thirdCall)
				// Both are queued (StartTell queues before it returns):
				// keeping the turn, they wait for it in one batch.
				if !noPipeline {
					r.waitPipelined(1)
				}
				close(first.gate.release)
				for _, o := range []toldResult{<-first.out, <-secondOut, <-thirdOut} {
					var pe *Error
					switch {
					case errors.As(o.err, &pe) && pe.Code == CodeBacklogFull:
						refused++
					case o.err != nil:
						t.Fatalf("tell: %v", o.err)
					}
				}
				return refused, r.svc.Backlog().Records
			}
			wantRefused, wantRecords := run(true)
			if wantRefused == 0 {
				t.Fatalf("no tell refused keeping the turn: the limit does not bite")
			}
			refused, records := run(false)
			if refused != wantRefused || records != wantRecords {
				t.Fatalf("pipelined: %d refused, %d records retained; keeping the turn: %d refused, %d records", refused, records, wantRefused, wantRecords)
			}
		})
	}
}

// slowMemory is the memory store whose flushes take a while, as a sync
// does, so that commits are in flight while the next batch is decided.
type slowMemory struct {
	*store.Memory
	delay time.Duration
}

func (m *slowMemory) Flush() error {
	time.Sleep(m.delay)
	return m.Memory.Flush()
}

// Eviction under pipelined batches (rule 6): with a backlog window and
// budget small enough that every install evicts and every release trims,
// two tellers per conversation race while a reader of each takes what is
// published; every record is offered with the payload it was told with,
// and the race detector sees no write to records a batch decides on.
func TestPipeline_EvictionUnderRacingTellers(t *testing.T) {
	const (
		convs   = 3
		tells   = 60
		payload = 48
	)
	sm := &slowMemory{Memory: store.NewMemory(), delay: 200 * time.Microsecond}
	svc, err := Open(context.Background(), sm, Options{NodeKey: testKey, BacklogWindowBytes: 2 * payload, MaxBacklogBytes: 4 * payload})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	type teller struct {
		conn  *Conn
		bound Bound
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		told   = map[ConversationID]map[Seq][]byte{}
		seen   = map[ConversationID]map[Seq][]byte{}
		errs   []error
		stop   = make(chan struct{})
		reader sync.WaitGroup
	)
	readers := map[ConversationID]*Conn{}
	for c := ConversationID(1); c <= convs; c++ {
		told[c], seen[c] = map[Seq][]byte{}, map[Seq][]byte{}
	}
	// read offers a participant its records from its acknowledged cursor
	// over and over, and acknowledges half of what it was offered.
	read := func(c ConversationID, rd teller) {
		defer reader.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// From the acknowledged cursor, every round: what is
			// offered again must be what was offered before.
			rd.conn.SetOfferedForTest(c, Offered{})
			var delivered []Seq
			for {
				d, ok := rd.conn.Next(c)
				if !ok {
					break
				}
				if d.Kind != outbox.KindRecord {
					continue
				}
				mu.Lock()
				if was, ok := seen[c][d.Seq]; ok && string(was) != string(d.Payload) {
					errs = append(errs, fmt.Errorf("conversation %v record %v offered with %x, then %x", c, d.Seq, was, d.Payload))
				}
				seen[c][d.Seq] = append([]byte(nil), d.Payload...)
				mu.Unlock()
				delivered = append(delivered, d.Seq)
			}
			if len(delivered) > 0 {
				// Acknowledge the older half, so that acks (plain, and
				// pipelined) reclaim records of states that clones share.
				if _, err := rd.conn.Ack(ctx, Ack{Conversation: c, Participant: rd.bound.Participant, Generation: rd.bound.Generation, Through: delivered[len(delivered)/2]}); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}
	}
	for c := ConversationID(1); c <= convs; c++ {
		var ts []teller
		for i := range 3 {
			conn := svc.Connect(nil)
			b, err := conn.Enroll(ctx, Enroll{Conversation: c, Token: token(byte(10*c) + byte(i))})
			if err != nil {
				t.Fatal(err)
			}
			ts = append(ts, teller{conn, b})
		}
		readers[c] = ts[2].conn
		for _, rd := range ts {
			reader.Add(1)
			go read(c, rd)
		}
		for i := range 2 {
			wg.Add(1)
			go func(c ConversationID, tl teller, i int) {
				defer wg.Done()
				for n := range tells {
					var tok Token
					tok[0], tok[1], tok[2], tok[3] = byte(c), byte(i), byte(n), 0xee
					p := make([]byte, payload)
					copy(p, tok[:4])
					got, err := tl.conn.Tell(ctx, Tell{Conversation: c, Participant: tl.bound.Participant, Generation: tl.bound.Generation, Token: tok, Payload: p})
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else {
						told[c][got.Seq] = p
					}
					mu.Unlock()
				}
			}(c, ts[i], i)
		}
	}
	wg.Wait()
	close(stop)
	reader.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d tells failed, first: %v", len(errs), errs[0])
	}
	if svc.Pipelined() == 0 {
		t.Fatalf("no batch was decided while the one before it was in flight")
	}
	t.Logf("pipelined %d batches; backlog %+v", svc.Pipelined(), svc.Backlog())
	if b := svc.Backlog(); b.EvictedTotal == 0 {
		t.Fatalf("nothing was evicted: %+v", b)
	}
	for c, rc := range readers {
		for _, d := range drainNext(rc, c) {
			if d.Kind == outbox.KindRecord {
				seen[c][d.Seq] = d.Payload
			}
		}
		if len(told[c]) != 2*tells {
			t.Fatalf("conversation %v: %d tells told, want %d", c, len(told[c]), 2*tells)
		}
		for q, want := range told[c] {
			if got, ok := seen[c][q]; !ok || string(got) != string(want) {
				t.Fatalf("conversation %v record %v offered %x (offered: %v), want %x", c, q, got, ok, want)
			}
		}
	}
}

// A conversation contained by a batch decided while the one before it
// was in flight stays contained: a later batch is refused, as it is when
// each batch keeps its turn (ensureLoadedTurn refuses an unloadable
// conversation; TestDamagedTokenEntryContainsALoadedConversation), and
// not decided on the working state of the batch in flight, which skips
// the load and its check. Under steady load the pipeline need never
// drain, and the contained conversation would commit on.
func TestPipeline_AContainedConversationTakesNoMoreCommits(t *testing.T) {
	r, g := newGatedRig(t, Options{})
	ctx := context.Background()
	first := r.holdTell(false)

	// One batch: a's tell, whose token entry is damaged (the
	// conversation is contained), and b's, which commits.
	_, damaged := r.tellOf(true, 11)
	g.damage(tokenRef{p: damaged.Participant, t: damaged.Token}.key(pipeConv))
	cb, second := r.tellOf(false, 12)
	damagedCall, secondCall := r.ca.StartTell(ctx, damaged), cb.StartTell(ctx, second) // one batch
	damagedOut, secondOut := waitCall(damagedCall), waitCall(secondCall)
	r.waitPipelined(1)
	// The next batch, decided once the conversation is contained.
	_, third := r.tellOf(false, 13)
	thirdOut := waitCall(r.cb.StartTell(ctx, third))
	r.waitDequeued()
	close(first.gate.release)
	<-first.out
	<-secondOut
	if d := <-damagedOut; !errors.Is(d.err, ErrUnavailable) {
		t.Fatalf("tell with a damaged token entry = %+v, want unavailable", d)
	}
	if unl := r.svc.Unloadable(); len(unl) != 1 || unl[0].Class != ClassStoreCorrupt {
		t.Fatalf("Unloadable() = %+v, want the conversation as %s", unl, ClassStoreCorrupt)
	}
	if th := <-thirdOut; !errors.Is(th.err, ErrUnavailable) {
		t.Fatalf("tell decided after the conversation was contained = %+v, want unavailable", th)
	}
}

// Close with a pipeline in flight whose commit then fails: Close returns
// without waiting for the held commit, both batches answer in doubt once
// it fails, and no reload is left running (goleak in TestMain; waitReloads
// here).
func TestPipeline_CloseWithAFailingPipelineInFlight(t *testing.T) {
	r, _ := newGatedRig(t, Options{})
	firstOut, secondOut, gt := r.pipelineTell(true)
	// A reload already waiting for the pipeline to drain.
	cv := r.svc.existing(pipeConv)
	if !r.svc.pinForReload(cv) {
		t.Fatal("pinForReload: false")
	}
	go r.svc.reload(cv)
	closed := make(chan struct{})
	go func() {
		r.svc.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a commit in flight")
	}
	close(gt.release)
	for _, o := range []toldResult{<-firstOut, <-secondOut} {
		if !inDoubt(o.err) {
			t.Fatalf("outcome = %+v, want in_doubt", o)
		}
	}
	r.svc.bg.Wait()
}

// A pipeline has no depth bound (docs/DESIGN.md, Pipelined batches): a
// third batch may be decided on the second's state while the first is in
// flight. When the first then fails, the second is in doubt, and the
// third with it, or committed on the state reloaded from the store.
func TestPipeline_AFailureCarriesThroughADeeperPipeline(t *testing.T) {
	r, _ := newGatedRig(t, Options{})
	ctx := context.Background()
	firstOut, secondOut, gt := r.pipelineTell(true)
	_, third := r.tellOf(true, 12)
	thirdOut := waitCall(r.ca.StartTell(ctx, third))
	deadline := time.Now().Add(100 * time.Millisecond)
	depth3 := false
	for time.Now().Before(deadline) && !depth3 {
		depth3 = r.svc.Pipelined() > 1
		time.Sleep(time.Millisecond)
	}
	close(gt.release)
	for _, o := range []toldResult{<-firstOut, <-secondOut} {
		if !inDoubt(o.err) {
			t.Errorf("outcome = %+v, want in_doubt", o)
		}
	}
	// The third is decided on the second's state (in doubt with it) or,
	// when the second had failed by then, on the state reloaded from the
	// store (its own commit).
	if o := <-thirdOut; o.err != nil && !inDoubt(o.err) {
		t.Errorf("third outcome = %+v, want committed or in_doubt", o)
	}
	t.Logf("a third batch decided while the first was in flight: %v", depth3)
}

// teller is a participant of pipeConv bound on a connection of its own.
type teller struct {
	conn  *Conn
	bound Bound
}

// enrollTellers enrolls n participants in pipeConv, each on a connection
// of its own.
func enrollTellers(t *testing.T, svc *Service, n int) []teller {
	t.Helper()
	tellers := make([]teller, n)
	for i := range tellers {
		tellers[i].conn = svc.Connect(nil)
		b, err := tellers[i].conn.Enroll(context.Background(), Enroll{Conversation: pipeConv, Token: token(byte(1 + i))})
		if err != nil {
			t.Fatal(err)
		}
		tellers[i].bound = b
	}
	return tellers
}

// chain returns how many batches cv's last pipelined batch keeps
// reachable through prev, itself included; the caller holds cv's turn.
func chain(cv *conversation) int {
	n := 0
	for b := cv.inflight; b != nil; b = b.prev {
		n++
	}
	return n
}

// A batch keeps the batch before it only while it needs its outcome:
// under steady load on one conversation the pipeline need never drain,
// and batches that link every one before them would keep every batch
// since it last drained (its tasks, rows, payloads and a copy of the
// members each) reachable from the conversation.
func TestPipeline_FinishedBatchesAreNotKeptAlive(t *testing.T) {
	const tells = 100
	sm := &slowMemory{Memory: store.NewMemory(), delay: time.Millisecond}
	svc := openService(t, sm)
	ctx := context.Background()
	tellers := enrollTellers(t, svc, 2)
	var wg sync.WaitGroup
	for i, tl := range tellers {
		wg.Go(func() {
			for n := range tells {
				var tok Token
				tok[0], tok[1], tok[2] = byte(i), byte(n), 0xee
				if _, err := tl.conn.Tell(ctx, Tell{Conversation: pipeConv, Participant: tl.bound.Participant, Generation: tl.bound.Generation, Token: tok, Payload: []byte{byte(n)}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	cv := svc.existing(pipeConv)
	cv.turn <- struct{}{}
	n := chain(cv)
	<-cv.turn
	t.Logf("pipelined %d of %d batches", svc.Pipelined(), 2*tells)
	if n > 2 {
		t.Fatalf("the conversation keeps %d batches reachable (prev), want at most 2", n)
	}
}

// The backlog's memory bounds hold under a pipeline that never drains:
// an install that leaves its state's payloads to the next batch (rule 6)
// must not leave them to no one. Two tellers keep one conversation's
// pipeline full for a recipient that never reads; the payloads in memory
// must stay within the window of that conversation and the service's
// hard bound (backlog.go), give or take the batches in flight.
func TestPipeline_TheBacklogWindowHoldsUnderSteadyLoad(t *testing.T) {
	const (
		tells   = 150
		payload = 1 << 10
		window  = 4 * payload
		budget  = 16 * payload
	)
	sm := &slowMemory{Memory: store.NewMemory(), delay: time.Millisecond}
	svc, err := Open(context.Background(), sm, Options{NodeKey: testKey, BacklogWindowBytes: window, MaxBacklogBytes: budget})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	tellers := enrollTellers(t, svc, 3)
	var (
		wg   sync.WaitGroup
		peak atomic.Int64
	)
	for i, tl := range tellers[:2] { // the third never reads
		wg.Go(func() {
			for n := range tells {
				var tok Token
				tok[0], tok[1], tok[2] = byte(i), byte(n), 0xee
				if _, err := tl.conn.Tell(ctx, Tell{Conversation: pipeConv, Participant: tl.bound.Participant, Generation: tl.bound.Generation, Token: tok, Payload: make([]byte, payload)}); err != nil {
					t.Error(err)
					return
				}
				for m := svc.Backlog().MemoryBytes; m > peak.Load(); {
					if peak.CompareAndSwap(peak.Load(), m) {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	// Two batches in flight, each of at most two tells.
	const slack = 2 * 2 * payload
	t.Logf("pipelined %d of %d batches; peak %d bytes in memory; %+v", svc.Pipelined(), 2*tells, peak.Load(), svc.Backlog())
	if p := peak.Load(); p > window+slack {
		t.Fatalf("peak payload bytes in memory %d, want at most the window %d and %d in flight", p, window, slack)
	}
}
