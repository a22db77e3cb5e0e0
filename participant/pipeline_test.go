package participant_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/internal/peek"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/logfirst"
)

// pipelineRig is a service on the log-first store over faultfs with two
// participants of conversation 1, each on a connection of its own, and a
// gate on the log's syncs: hold makes the next one block until the test
// lets it go, so that a batch's commit stays in flight.
type pipelineRig struct {
	t    *testing.T
	ffs  *faultfs.FS
	dir  string
	opts logfirst.Options
	st   *logfirst.Store
	svc  *participant.Service
	a, b participant.Bound
	ca   *participant.Conn
	cb   *participant.Conn
	gate logGate
}

// logGate holds the log's next sync when armed (pipelineRig.hold).
type logGate struct {
	mu sync.Mutex
	// +checklocks:mu
	armed bool
	// +checklocks:mu
	fail bool
	// blocked is closed once the held sync blocks; release lets it go.
	// +checklocks:mu
	blocked chan struct{}
	// +checklocks:mu
	release chan struct{}
}

// take reports whether op is the sync to hold, disarming the gate, and
// returns the gate's channels and whether the sync is to fail.
func (g *logGate) take(op faultfs.Op, walDir string) (held bool, blocked, release chan struct{}, fail bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed || op.Kind != faultfs.OpSync || filepath.Dir(op.Path) != walDir {
		return false, nil, nil, false
	}
	g.armed = false
	return true, g.blocked, g.release, g.fail
}

// blockedCh returns the channel closed once the held sync blocks.
func (g *logGate) blockedCh() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked
}

// open lets a held sync go, if one is held and not let go yet.
func (g *logGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.release != nil {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
	}
}

const pipelineConv participant.ConversationID = 1

func newPipelineRig(t *testing.T) *pipelineRig {
	t.Helper()
	r := &pipelineRig{t: t, ffs: faultfs.New(), dir: t.TempDir()}
	r.opts = logfirst.Options{FS: r.ffs, CheckpointInterval: time.Hour, CheckpointBytes: 1 << 30}
	walDir := filepath.Join(r.dir, logfirst.WALDir)
	r.ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		held, blocked, release, fail := r.gate.take(op, walDir)
		if !held {
			return faultfs.None
		}
		close(blocked)
		<-release
		if fail {
			return faultfs.FailSync
		}
		return faultfs.None
	})
	r.open()
	ctx := context.Background()
	r.ca, r.cb = r.svc.Connect(nil), r.svc.Connect(nil)
	var err error
	if r.a, err = r.ca.Enroll(ctx, participant.Enroll{Conversation: pipelineConv, Token: participanttest.TokenOf(1)}); err != nil {
		t.Fatal(err)
	}
	if r.b, err = r.cb.Enroll(ctx, participant.Enroll{Conversation: pipelineConv, Token: participanttest.TokenOf(2)}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *pipelineRig) open() {
	r.t.Helper()
	st, err := logfirst.Open(r.dir, r.opts)
	if err != nil {
		r.t.Fatalf("logfirst.Open: %v", err)
	}
	svc, err := participant.Open(context.Background(), st, participant.Options{NodeKey: participanttest.NodeKey})
	if err != nil {
		st.Close()
		r.t.Fatalf("participant.Open: %v", err)
	}
	r.st, r.svc = st, svc
	r.t.Cleanup(func() {
		r.gate.open() // a test that failed holding the gate
		r.svc.Close()
		r.st.Close()
	})
}

// hold makes the next log sync block until release is closed (and fail
// the Linux way with fail), and returns release.
func (r *pipelineRig) hold(fail bool) chan struct{} {
	g := &r.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.fail = true, fail
	g.blocked, g.release = make(chan struct{}), make(chan struct{})
	return g.release
}

type toldOrErr struct {
	told participant.Told
	err  error
}

// tell starts a's (or b's) tell with token n and returns its outcome's
// channel.
func (r *pipelineRig) tell(byA bool, n byte) (participant.Tell, <-chan toldOrErr) {
	c, p := r.cb, r.b
	if byA {
		c, p = r.ca, r.a
	}
	req := participant.Tell{Conversation: pipelineConv, Participant: p.Participant, Generation: p.Generation,
		Token: participanttest.TokenOf(n), Payload: []byte{n}}
	out := make(chan toldOrErr, 1)
	go func() {
		told, err := c.Tell(context.Background(), req)
		out <- toldOrErr{told, err}
	}()
	return req, out
}

// holdTell makes the next log sync block (and fail with fail, hold),
// starts a's tell with token 10 and returns once its sync blocks: the
// tell, its outcome's channel, and the channel that lets the sync go.
func (r *pipelineRig) holdTell(fail bool) (participant.Tell, <-chan toldOrErr, chan struct{}) {
	r.t.Helper()
	release := r.hold(fail)
	req, out := r.tell(true, 10)
	<-r.gate.blockedCh()
	return req, out, release
}

// pipelineTell holds a's tell with token 10 (holdTell), starts b's with
// token 11, and returns once b's batch was decided on the state of a's,
// in flight: both tells and their outcomes, and the channel that lets
// a's sync go.
func (r *pipelineRig) pipelineTell(fail bool) (reqA participant.Tell, first <-chan toldOrErr, reqB participant.Tell, second <-chan toldOrErr, release chan struct{}) {
	r.t.Helper()
	reqA, first, release = r.holdTell(fail)
	reqB, second = r.tell(false, 11)
	r.waitPipelined(1)
	return reqA, first, reqB, second, release
}

// waitPipelined waits until n batches were decided while the one before
// them was in flight.
func (r *pipelineRig) waitPipelined(n uint64) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.svc.Pipelined() < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("Pipelined = %d, want %d", r.svc.Pipelined(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// notYet fails the test when an outcome is on ch already.
func notYet[T any](t *testing.T, what string, ch <-chan T) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s answered while the commit before it was in flight: %+v", what, v)
	case <-time.After(50 * time.Millisecond):
	}
}

// A tell read while the tell before it is being written is decided on
// that tell's state and appended meanwhile, and answered after it.
func TestPipeline_ATellIsDecidedWhileTheOneBeforeIsInFlight(t *testing.T) {
	r := newPipelineRig(t)
	_, first, _, second, release := r.pipelineTell(false)
	notYet(t, "the first tell", first)
	notYet(t, "the second tell", second)
	close(release)
	f, s := <-first, <-second
	if f.err != nil || s.err != nil {
		t.Fatalf("tells = %+v, %+v", f, s)
	}
	if s.told.Seq != f.told.Seq+1 {
		t.Fatalf("second tell seq %v, want %v: not decided on the first's state", s.told.Seq, f.told.Seq+1)
	}
}

// A retry of a tell whose commit is in flight replays it only once its
// row is durable: the retry's batch, decided while the first is in
// flight, waits for it.
func TestPipeline_ARetryOfATellInFlightIsAnsweredOnceItIsDurable(t *testing.T) {
	r := newPipelineRig(t)
	req, first, release := r.holdTell(false)
	retry := make(chan toldOrErr, 1)
	go func() {
		told, err := r.ca.Tell(context.Background(), req)
		retry <- toldOrErr{told, err}
	}()
	r.waitPipelined(1)
	notYet(t, "the retry", retry)
	close(release)
	f, rt := <-first, <-retry
	if f.err != nil || rt.err != nil || rt.told.Seq != f.told.Seq || rt.told.Replay != participant.ReplayCommitted {
		t.Fatalf("tell = %+v, retry = %+v; want the retry to replay the tell's seq", f, rt)
	}
}

// When the commit in flight fails, the batch decided on it fails too, in
// doubt: its rows follow the failed ones, and it decided on their state.
// After a restart each retry commits or replays, once.
func TestPipeline_AFailedCommitFailsTheBatchDecidedOnIt(t *testing.T) {
	r := newPipelineRig(t)
	reqA, first, reqB, second, release := r.pipelineTell(true)
	close(release)
	for _, o := range []toldOrErr{<-first, <-second} {
		var pe *participant.Error
		if !errors.As(o.err, &pe) || pe.Code != participant.CodeInDoubt {
			t.Fatalf("outcome = %+v, want in_doubt", o)
		}
	}
	// The failed log is sticky: restart on the data directory as a power
	// cut leaves it, attach both again, and retry: each tell commits or
	// replays, once, at a seq of its own.
	r.svc.Close()
	r.st.Close()
	if err := r.ffs.Crash(nil); err != nil {
		t.Fatal(err)
	}
	r.ffs.SetRule(nil)
	r.open()
	ctx := context.Background()
	seqs := map[participant.Seq]bool{}
	for i, c := range []struct {
		bound participant.Bound
		req   participant.Tell
	}{{r.a, reqA}, {r.b, reqB}} {
		conn := r.svc.Connect(nil)
		nb, err := conn.Attach(ctx, participant.Attach{Conversation: pipelineConv, Participant: c.bound.Participant,
			Generation: c.bound.Generation, Secret: c.bound.Secret, Token: participanttest.TokenOf(byte(20 + i))})
		if err != nil {
			t.Fatalf("attach %v: %v", c.bound.Participant, err)
		}
		c.req.Generation = nb.Generation
		told, err := conn.Tell(ctx, c.req)
		if err != nil {
			t.Fatalf("retry of %v's tell: %v", c.bound.Participant, err)
		}
		again, err := conn.Tell(ctx, c.req)
		if err != nil || again.Seq != told.Seq || again.Replay != participant.ReplayCommitted {
			t.Fatalf("second retry = %+v, %v; want seq %v replayed", again, err, told.Seq)
		}
		if seqs[told.Seq] {
			t.Fatalf("seq %v answered twice", told.Seq)
		}
		seqs[told.Seq] = true
	}
}

// Whatever takes a conversation's turn other than a batch waits for the
// batch in flight: it relies on nothing of the conversation being written
// but by itself.
func TestPipeline_AnotherTurnHolderWaitsForTheBatchInFlight(t *testing.T) {
	r := newPipelineRig(t)
	_, first, release := r.holdTell(false)
	held := make(chan func(), 1)
	go func() {
		_, let := peek.HoldTurn(r.svc, pipelineConv)
		held <- let
	}()
	notYet(t, "the turn", held)
	close(release)
	if f := <-first; f.err != nil {
		t.Fatal(f.err)
	}
	let := <-held
	let()
}
