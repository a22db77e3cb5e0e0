package participant

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// Adversarial tests of pipelined batches (pipeline.go): each shows a rule
// of docs/DESIGN.md "Pipelined batches" that a batch decided while the one
// before it is in flight can break.

// pipeRig is a service over faultstore on the memory store (which keeps
// its writes' order, so batches pipeline) with two participants of one
// conversation, each on a connection of its own.
type pipeRig struct {
	t      *testing.T
	fs     *faultstore.Store
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
	ctx := context.Background()
	r.ca, r.cb = svc.Connect(nil), svc.Connect(nil)
	if r.a, err = r.ca.Enroll(ctx, Enroll{Conversation: pipeConv, Token: token(1)}); err != nil {
		t.Fatal(err)
	}
	if r.b, err = r.cb.Enroll(ctx, Enroll{Conversation: pipeConv, Token: token(2)}); err != nil {
		t.Fatal(err)
	}
	return r
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

var _ = errors.Is
