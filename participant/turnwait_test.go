package participant

import (
	"context"
	"testing"
	"time"
)

// TestAwait_AWaiterWhoseOperationIsInFlightTakesNoTurn: two tells of one
// conversation are decided in one batch, which hands the turn on while
// its commit is held. The waiter of the tell that did not lead the batch
// has its outcome on its way and nothing to lead: it waits for the
// outcome instead of taking the free turn, finding the queue empty and
// giving the turn back, in a loop, for as long as the commit takes.
//
// Before, it did, spinning: 530,000 to 980,000 idle turns in the 100 ms
// of the held commit; in participantbench (64 clients) ten to sixteen
// idle turns for every batch.
func TestAwait_AWaiterWhoseOperationIsInFlightTakesNoTurn(t *testing.T) {
	r, g := newGatedRig(t, Options{})
	ctx := context.Background()
	gt := g.arm(false)
	ca, tellA := r.tellOf(true, 10)
	cb, tellB := r.tellOf(false, 11)
	// Queued together, before either is waited for: whichever waiter
	// takes the turn first decides both in one batch.
	callA, callB := ca.StartTell(ctx, tellA), cb.StartTell(ctx, tellB)
	outA, outB := waitCall(callA), waitCall(callB)
	<-gt.blocked
	r.waitDequeued()
	before := r.svc.idleTurns.Load()
	time.Sleep(100 * time.Millisecond)
	idle := r.svc.idleTurns.Load() - before
	close(gt.release)
	a, b := <-outA, <-outB
	if a.err != nil || b.err != nil {
		t.Fatalf("tells = %+v, %+v", a, b)
	}
	if b.told.Seq != a.told.Seq+1 {
		t.Fatalf("seqs %d, %d: want one batch, in order", a.told.Seq, b.told.Seq)
	}
	if idle > 1 {
		t.Fatalf("%d idle turns taken in 100 ms of a held commit, want at most 1", idle)
	}
}
