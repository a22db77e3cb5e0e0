package fence_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/participantd/participantd/fence"
)

// waitSignal returns a hook for fence.SetLeaseWaitHook and the channel it
// signals on each time a waiter is about to block. The channel holds up to
// n signals, so the hook never blocks the waiter.
func waitSignal(n int) (func(fence.Token), <-chan struct{}) {
	entered := make(chan struct{}, n)
	return func(fence.Token) {
		select {
		case entered <- struct{}{}:
		default:
		}
	}, entered
}

// A completion that arrives while its lease is still being appended is
// accepted only after the lease settles: Accept hosts the wait itself.
//
// The ordering is proved without sleeping: the hook shows the accepting
// goroutine is inside the wait, its result channel is then still empty and
// its generation still unconsumed, and a shared clock stamps the lease
// before the acceptance returns.
func TestACompletionRacingItsLeaseIsAcceptedOnlyAfterTheLeaseSettles(t *testing.T) {
	f := fence.New[site](fence.Options{})
	hook, entered := waitSignal(1)
	fence.SetLeaseWaitHook(f, hook)
	s := site{conversation: 4, participant: 1}
	tok := f.Issue(s, runKey(s, 1), 1)
	f.ArmLease(tok)

	var clock, acceptedAt atomic.Uint64
	result := make(chan error, 1)
	go func() {
		_, err := f.Accept(context.Background(), s, tok)
		acceptedAt.Store(clock.Add(1))
		result <- err
	}()

	<-entered // the completion is in flight, parked on its lease
	select {
	case err := <-result:
		t.Fatalf("Accept returned %v while the lease was pending, want it to wait", err)
	default:
	}
	if !f.LeasePending(tok) {
		t.Fatal("LeasePending = false before SettleLease, want true")
	}
	if got := fence.Outstanding(f, s); got != 1 {
		t.Fatalf("Outstanding while the lease is pending = %d, want 1 (not yet consumed)", got)
	}

	leaseLanded := clock.Add(1) // the lease lands now
	f.SettleLease(tok)
	if err := <-result; err != nil {
		t.Fatalf("Accept after SettleLease = %v, want nil", err)
	}
	if got := acceptedAt.Load(); got <= leaseLanded {
		t.Fatalf("completion accepted at %d, lease landed at %d: accepted before its lease", got, leaseLanded)
	}
	if got := fence.Outstanding(f, s); got != -1 {
		t.Fatalf("Outstanding after Accept = %d, want -1 (consumed)", got)
	}
}

// A token that was never armed never waits, and a waiter on an armed one is
// released by SettleLease.
func TestAnUnarmedTokenNeverWaitsAndASettledOneIsReleased(t *testing.T) {
	f := fence.New[site](fence.Options{})
	hook, entered := waitSignal(1)
	fence.SetLeaseWaitHook(f, hook)
	s := site{conversation: 4, participant: 2}
	tok := f.Issue(s, runKey(s, 1), 1)

	if err := f.LeaseSettled(context.Background(), tok); err != nil {
		t.Fatalf("LeaseSettled(unarmed) = %v, want nil", err)
	}
	f.ArmLease(tok)
	if !f.LeasePending(tok) {
		t.Fatal("LeasePending after ArmLease = false, want true")
	}
	waiter := make(chan error, 1)
	go func() { waiter <- f.LeaseSettled(context.Background(), tok) }()
	<-entered

	f.SettleLease(tok)
	if err := <-waiter; err != nil {
		t.Fatalf("LeaseSettled after SettleLease = %v, want nil", err)
	}
	if f.LeasePending(tok) {
		t.Fatal("LeasePending after SettleLease = true, want false")
	}
	// Settled stays settled: a later wait returns at once, even with a
	// context that has already ended.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.LeaseSettled(ctx, tok); err != nil {
		t.Fatalf("LeaseSettled(settled, ended ctx) = %v, want nil", err)
	}
	f.SettleLease(tok) // settling twice does nothing
}

// SettleLease wakes every waiter on the token, not just one.
func TestSettlingALeaseReleasesEveryWaiter(t *testing.T) {
	const waiters = 16
	f := fence.New[site](fence.Options{})
	hook, entered := waitSignal(waiters)
	fence.SetLeaseWaitHook(f, hook)
	s := site{conversation: 4, participant: 3}
	tok := f.Issue(s, runKey(s, 1), 1)
	f.ArmLease(tok)
	f.ArmLease(tok) // arming twice changes nothing

	done := make(chan error, waiters)
	for range waiters {
		go func() { done <- f.LeaseSettled(context.Background(), tok) }()
	}
	for range waiters {
		<-entered
	}
	f.SettleLease(tok)
	for range waiters {
		if err := <-done; err != nil {
			t.Fatalf("LeaseSettled = %v, want nil", err)
		}
	}
}

// A wait on a pending lease ends with its context, and an Accept that gave
// up consumed nothing: once the lease settles, the completion is accepted.
func TestALeaseWaitEndsWithItsContextAndConsumesNothing(t *testing.T) {
	f := fence.New[site](fence.Options{})
	hook, entered := waitSignal(1)
	fence.SetLeaseWaitHook(f, hook)
	s := site{conversation: 4, participant: 4}
	tok := f.Issue(s, runKey(s, 1), 1)
	f.ArmLease(tok)

	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() {
		_, err := f.Accept(ctx, s, tok)
		result <- err
	}()
	<-entered
	cancel()
	err := <-result
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Accept with a cancelled wait = %v, want context.Canceled", err)
	}
	var rej *fence.RejectionError
	if errors.As(err, &rej) {
		t.Fatalf("Accept with a cancelled wait = %v, want no rejection: the token was never judged", err)
	}
	if !f.LeasePending(tok) {
		t.Fatal("LeasePending after the waiter gave up = false, want true")
	}
	if got := fence.Outstanding(f, s); got != 1 {
		t.Fatalf("Outstanding after a cancelled Accept = %d, want 1", got)
	}

	f.SettleLease(tok)
	accept(t, f, s, tok)
}

// A waiter released by a settle checks again, so a token re-armed for a
// later lease before the waiter ran keeps it waiting for that lease.
func TestAWaiterWaitsAgainForALeaseReArmedBeforeItRan(t *testing.T) {
	f := fence.New[site](fence.Options{})
	hook, entered := waitSignal(2)
	s := site{conversation: 4, participant: 5}
	tok := f.Issue(s, runKey(s, 1), 1)

	// Hold the waiter at the hook so settle and re-arm land while it is
	// between the check and the wait.
	release := make(chan struct{})
	var calls atomic.Int32
	fence.SetLeaseWaitHook(f, func(tk fence.Token) {
		if calls.Add(1) == 1 {
			hook(tk)
			<-release
			return
		}
		hook(tk)
	})
	f.ArmLease(tok)
	waiter := make(chan error, 1)
	go func() { waiter <- f.LeaseSettled(context.Background(), tok) }()
	<-entered

	f.SettleLease(tok)
	f.ArmLease(tok)
	close(release)
	<-entered // it woke on the first settle and is waiting on the re-armed lease
	select {
	case err := <-waiter:
		t.Fatalf("LeaseSettled returned %v while the re-armed lease was pending, want it to wait", err)
	default:
	}
	f.SettleLease(tok)
	if err := <-waiter; err != nil {
		t.Fatalf("LeaseSettled after the second settle = %v, want nil", err)
	}
}

// A caller holding a token's lease armed itself accepts its completion
// with AcceptHeld without waiting at the gate (Accept would wait on the
// caller), consumes the generation exactly once, and its accepted
// generation restores after a failed settlement like any other.
func TestACompletionHeldByItsOwnLeaseHolderIsAcceptedWithoutWaiting(t *testing.T) {
	f := fence.New[site](fence.Options{})
	fence.SetLeaseWaitHook(f, func(fence.Token) {
		t.Error("AcceptHeld waited at the lease gate")
	})
	s := site{conversation: 6, participant: 0}
	tok := f.Issue(s, runKey(s, 1), 1)
	f.ArmLease(tok)

	acc, err := f.AcceptHeld(s, tok)
	if err != nil {
		t.Fatalf("AcceptHeld with the lease armed = %v, want nil", err)
	}
	if got := fence.Outstanding(f, s); got != -1 {
		t.Fatalf("Outstanding after AcceptHeld = %d, want -1 (consumed)", got)
	}
	if !f.LeasePending(tok) {
		t.Fatal("AcceptHeld settled the lease; only its holder settles it")
	}
	_, err = f.AcceptHeld(s, tok)
	wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration, "second AcceptHeld of a consumed generation")

	// The settlement failed: the generation comes back, and the holder
	// revokes the token it issued, leaving nothing.
	if !f.RestoreIfAbsent(s, acc) {
		t.Fatal("RestoreIfAbsent after a failed settlement = false, want true")
	}
	f.Revoke(s, tok)
	f.SettleLease(tok)
	if got := fence.Outstanding(f, s); got != -1 {
		t.Fatalf("Outstanding after restore then revoke = %d, want -1", got)
	}
}

// AcceptHeld refuses exactly as Accept does: the zero token, a site with
// no generation, and a token the generation does not hold (superseded by
// a later issue), consuming nothing.
func TestAcceptHeldRefusesAsAcceptDoes(t *testing.T) {
	f := fence.New[site](fence.Options{})
	s := site{conversation: 6, participant: 1}
	_, err := f.AcceptHeld(s, fence.Token{})
	wantRejection(t, err, fence.ErrMissingToken, fence.MissingToken, "zero token")
	old := f.Issue(s, runKey(s, 1), 1)
	_, err = f.AcceptHeld(site{conversation: 6, participant: 2}, old)
	wantRejection(t, err, fence.ErrNoCurrentGeneration, fence.NoCurrentGeneration, "site without a generation")
	cur := f.Issue(s, runKey(s, 2), 1)
	_, err = f.AcceptHeld(s, old)
	wantRejection(t, err, fence.ErrStaleGeneration, fence.StaleGeneration, "superseded token")
	if got := fence.Outstanding(f, s); got != 1 {
		t.Fatalf("Outstanding after refusals = %d, want 1", got)
	}
	accept(t, f, s, cur)
}
