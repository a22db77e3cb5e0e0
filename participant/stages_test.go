package participant

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// slowFailure is how long an injected failure takes in the stage tests: a
// failing fsync or etcd round is seldom instant, and the stage it is
// timed in must then hold at least this much.
const slowFailure = 20 * time.Millisecond

// stageSum is the sum of the stages the service times (all but the
// connection's).
func stageSum(st Stages) time.Duration {
	return st.Turn + st.Decide + st.Oplog + st.CommitWait + st.Commit + st.Prev + st.Publish
}

// checkStagesSound fails when a stage of st is negative or the stages,
// which follow each other, sum to more than the time from started (at
// or before the operation's start) to the outcome.
func checkStagesSound(t *testing.T, what string, st Stages, started time.Time) {
	t.Helper()
	for name, d := range map[string]time.Duration{"Turn": st.Turn, "Decide": st.Decide, "Oplog": st.Oplog,
		"CommitWait": st.CommitWait, "Commit": st.Commit, "Prev": st.Prev, "Publish": st.Publish} {
		if d < 0 {
			t.Errorf("%s: Stages.%s = %v, want >= 0", what, name, d)
		}
	}
	if st.Done.IsZero() {
		t.Fatalf("%s: Stages.Done is zero for an operation that reached a batch", what)
	}
	if sum, whole := stageSum(st), st.Done.Sub(started); sum > whole {
		t.Errorf("%s: stages sum to %v, more than the %v from its start to its outcome (%+v)", what, sum, whole, st)
	}
}

// A batch whose writes fail at one of its barriers is timed to the
// failure: the stages before it as usual, the stage it failed in until
// the outcome (the failure's own time in it), and no stage after it,
// publish included (nothing was published). The next batch, which
// succeeds, is timed on its own. Under a store that keeps a
// conversation's writes in order both barriers share one flush; under one
// that does not (cluster mode) barrier 1 is a seal of its own.
func TestStages_AFailedBatchIsTimedToItsFailure(t *testing.T) {
	appendTo := func(prefix string) faultstore.Rule {
		return faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(prefix)))
	}
	flushOf := func(prefix string) faultstore.Rule {
		return faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(prefix)))
	}
	for _, tc := range []struct {
		name      string
		unordered bool
		rule      faultstore.Rule
		// split and barriers are the Stages flags the failure leaves:
		// barrier 1 on its own passed, barrier 2 (or the shared sync)
		// reached.
		split, barriers bool
		// in is the stage the failure is timed in.
		in func(Stages) time.Duration
	}{
		{"ordered/oplog append", false, appendTo("oplog/1"), false, false, func(s Stages) time.Duration { return s.Decide }},
		{"ordered/outbox append", false, appendTo("outbox/1"), false, true, func(s Stages) time.Duration { return s.Commit }},
		{"ordered/shared flush", false, flushOf("oplog/1"), false, true, func(s Stages) time.Duration { return s.Commit }},
		{"unordered/oplog append", true, appendTo("oplog/1"), false, false, func(s Stages) time.Duration { return s.Decide }},
		{"unordered/seal", true, flushOf("oplog/1"), true, false, func(s Stages) time.Duration { return s.Oplog }},
		{"unordered/outbox append", true, appendTo("outbox/1"), true, true, func(s Stages) time.Duration { return s.Commit }},
		{"unordered/outbox flush", true, flushOf("outbox/1"), true, true, func(s Stages) time.Duration { return s.Commit }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			fs := faultstore.New(store.NewMemory())
			fs.SetUnordered(tc.unordered)
			// A failure takes slowFailure before it is returned.
			fs.SetObserver(func(_ faultstore.Op, a faultstore.Action, _ error) {
				if a == faultstore.Fail {
					time.Sleep(slowFailure)
				}
			})
			svc := openService(t, fs)
			c := svc.Connect(nil)
			b := mustEnroll(t, c, 1, 1)

			fs.SetRules(tc.rule)
			started := time.Now()
			call := c.StartTell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(2), Payload: []byte("x")})
			if _, err := call.Wait(); !errors.Is(err, &Error{Code: CodeInDoubt}) {
				t.Fatalf("Tell failing at its %s = %v, want in_doubt", tc.name, err)
			}
			st := call.Stages()
			checkStagesSound(t, "the failed tell", st, started)
			if !st.Failed {
				t.Errorf("the failed tell's Stages.Failed = false, want true")
			}
			if st.Split != tc.split || st.Barriers != tc.barriers {
				t.Errorf("the failed tell's Stages Split, Barriers = %v, %v, want %v, %v", st.Split, st.Barriers, tc.split, tc.barriers)
			}
			if !st.Split && st.Oplog != 0 {
				t.Errorf("the failed tell's Oplog = %v without barrier 1 on its own, want 0", st.Oplog)
			}
			if !st.Barriers && (st.CommitWait != 0 || st.Commit != 0) {
				t.Errorf("the failed tell's CommitWait, Commit = %v, %v without barrier 2, want 0", st.CommitWait, st.Commit)
			}
			if st.Publish != 0 {
				t.Errorf("the failed tell's Publish = %v, want 0: nothing was published", st.Publish)
			}
			if d := tc.in(st); d < slowFailure {
				t.Errorf("the stage the tell failed in holds %v, want at least the failure's %v (%+v)", d, slowFailure, st)
			}

			fs.SetRules()
			started = time.Now()
			call = c.StartTell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(3), Payload: []byte("y")})
			if _, err := call.Wait(); err != nil {
				t.Fatalf("Tell after the failure: %v", err)
			}
			st = call.Stages()
			checkStagesSound(t, "the next tell", st, started)
			if st.Failed || !st.Barriers || st.Split != tc.unordered {
				t.Errorf("the next tell's Stages Failed, Barriers, Split = %v, %v, %v, want false, true, %v", st.Failed, st.Barriers, st.Split, tc.unordered)
			}
		})
	}
}

// An operation whose conversation cannot be loaded is timed to the
// failure in decide, and passes no later stage.
func TestStages_AFailedLoadIsTimedInDecide(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	svc := openService(t, fs)
	c := svc.Connect(nil)
	b := mustEnroll(t, c, 1, 1)
	svc.Forget(1)

	fs.SetRules(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpRead), faultstore.Prefix("oplog/1")))
	started := time.Now()
	call := c.StartTell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(2), Payload: []byte("x")})
	if _, err := call.Wait(); err == nil {
		t.Fatal("Tell on a conversation that cannot be loaded succeeded")
	}
	st := call.Stages()
	checkStagesSound(t, "the tell", st, started)
	if !st.Failed || st.Split || st.Barriers || st.Publish != 0 {
		t.Errorf("the tell's Stages = %+v, want Failed and no stage after Decide", st)
	}
}

// A batch clock's stages partition the time from the start to the
// outcome among the stages the batch passed, whatever barrier it failed
// at: each such instant is in exactly one stage.
func TestBatchClock_Stages(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	t0 := time.Now()
	at := func(n int) time.Time { return t0.Add(ms(n)) }
	for _, tc := range []struct {
		name string
		k    batchClock
		want Stages
	}{
		{"replays only", batchClock{began: at(1)},
			Stages{Turn: ms(1), Decide: ms(9)}},
		{"failed load", batchClock{began: at(1), failed: true},
			Stages{Turn: ms(1), Decide: ms(9), Failed: true}},
		{"shared sync", batchClock{began: at(1), decided: at(3), durable: at(8), flush: store.FlushTiming{Wait: ms(2), Write: ms(3)}, barriers: true},
			Stages{Turn: ms(1), Decide: ms(2), CommitWait: ms(2), Commit: ms(3), Publish: ms(2), Barriers: true}},
		{"shared sync failed", batchClock{began: at(1), decided: at(3), barriers: true, failed: true},
			Stages{Turn: ms(1), Decide: ms(2), Commit: ms(7), Barriers: true, Failed: true}},
		{"split", batchClock{began: at(1), decided: at(3), durable: at(8), oplog: ms(1), flush: store.FlushTiming{Wait: ms(2), Write: ms(2)}, split: true, barriers: true},
			Stages{Turn: ms(1), Decide: ms(2), Oplog: ms(1), CommitWait: ms(2), Commit: ms(2), Publish: ms(2), Barriers: true, Split: true}},
		{"split seal failed", batchClock{began: at(1), decided: at(3), split: true, failed: true},
			Stages{Turn: ms(1), Decide: ms(2), Oplog: ms(7), Split: true, Failed: true}},
		{"split outbox failed", batchClock{began: at(1), decided: at(3), oplog: ms(1), split: true, barriers: true, failed: true},
			Stages{Turn: ms(1), Decide: ms(2), Oplog: ms(1), Commit: ms(6), Barriers: true, Split: true, Failed: true}},
		{"split, barrier 1's wait failed after barrier 2's flush", batchClock{began: at(1), decided: at(3), oplog: ms(1), flush: store.FlushTiming{Wait: ms(2), Write: ms(1)}, split: true, barriers: true, failed: true},
			Stages{Turn: ms(1), Decide: ms(2), Oplog: ms(1), CommitWait: ms(2), Commit: ms(4), Barriers: true, Split: true, Failed: true}},
		// Decided on the state of the batch before it, in flight: the
		// wait for its outcome is Prev, out of the stage it fell in.
		{"pipelined, prev waited for after the flush", batchClock{began: at(1), decided: at(3), prevFrom: at(6), prev: ms(1), durable: at(8), flush: store.FlushTiming{Wait: ms(2), Write: ms(1)}, barriers: true},
			Stages{Turn: ms(1), Decide: ms(2), CommitWait: ms(2), Commit: ms(2), Prev: ms(1), Publish: ms(2), Barriers: true, Pipelined: true}},
		{"pipelined, prev failed", batchClock{began: at(1), decided: at(3), prevFrom: at(6), prev: ms(2), barriers: true, failed: true},
			Stages{Turn: ms(1), Decide: ms(2), Commit: ms(5), Prev: ms(2), Barriers: true, Pipelined: true, Failed: true}},
		{"replays only, after prev", batchClock{began: at(1), prevFrom: at(2), prev: ms(3)},
			Stages{Turn: ms(1), Decide: ms(6), Prev: ms(3), Pipelined: true}},
		{"keeping the turn after prev, prev waited for before the appends", batchClock{began: at(1), prevFrom: at(2), prev: ms(1), decided: at(4), durable: at(8), flush: store.FlushTiming{Wait: ms(2), Write: ms(2)}, barriers: true},
			Stages{Turn: ms(1), Decide: ms(2), CommitWait: ms(2), Commit: ms(2), Prev: ms(1), Publish: ms(2), Barriers: true, Pipelined: true}},
	} {
		done := at(10)
		tc.want.Done = done
		got := tc.k.stages(t0, done)
		if got != tc.want {
			t.Errorf("%s: stages = %+v, want %+v", tc.name, got, tc.want)
		}
		if sum := stageSum(got); sum != done.Sub(t0) {
			t.Errorf("%s: stages sum to %v, want the whole %v", tc.name, sum, done.Sub(t0))
		}
	}
}

// A batch decided while the one before it is in flight waits for that
// batch's outcome once its own flush returned: that wait is Prev, and
// Commit is its commit's write and sync alone.
func TestStages_APipelinedBatchWaitsForTheOneBeforeInPrev(t *testing.T) {
	r, _ := newGatedRig(t, Options{})
	first := r.holdTell(false)
	c, req := r.tellOf(false, 11)
	started := time.Now()
	call := c.StartTell(context.Background(), req)
	out := waitCall(call)
	r.waitPipelined(1)
	heldFrom := time.Now()
	answeredEarly(t, "the second tell", out)
	close(first.gate.release)
	held := time.Since(heldFrom)
	if f := <-first.out; f.err != nil {
		t.Fatalf("first tell: %v", f.err)
	}
	if s := <-out; s.err != nil {
		t.Fatalf("second tell: %v", s.err)
	}
	st := call.Stages()
	checkStagesSound(t, "the second tell", st, started)
	if !st.Pipelined || !st.Barriers || st.Failed {
		t.Errorf("the second tell's Stages Pipelined, Barriers, Failed = %v, %v, %v, want true, true, false", st.Pipelined, st.Barriers, st.Failed)
	}
	if st.Prev < held/2 || st.Commit >= held/2 {
		t.Errorf("the second tell's Prev, Commit = %v, %v with the tell before it held %v: want the wait in Prev, not in Commit", st.Prev, st.Commit, held)
	}
}
