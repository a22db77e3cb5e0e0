package fence

import (
	"context"
	"fmt"
)

// ArmLease marks token's lease append as in flight: Accept and LeaseSettled
// for token wait until SettleLease runs. Arming an armed token changes
// nothing.
func (f *Fences[K]) ArmLease(token Token) {
	f.gateMu.Lock()
	defer f.gateMu.Unlock()
	if _, ok := f.pending[token]; ok {
		return
	}
	if f.pending == nil {
		f.pending = make(map[Token]chan struct{})
	}
	f.pending[token] = make(chan struct{})
}

// SettleLease records that token's lease append has landed, failed or been
// abandoned, and releases every waiter on it. The caller settles on every
// path, so that nothing waits on a lease that will never be recorded.
// Settling an unarmed or settled token does nothing.
func (f *Fences[K]) SettleLease(token Token) {
	f.gateMu.Lock()
	ch, ok := f.pending[token]
	delete(f.pending, token)
	f.gateMu.Unlock()
	if ok {
		close(ch)
	}
}

// LeasePending reports whether token's lease append is still in flight.
func (f *Fences[K]) LeasePending(token Token) bool {
	f.gateMu.Lock()
	defer f.gateMu.Unlock()
	_, ok := f.pending[token]
	return ok
}

// LeaseSettled waits until token's lease append is no longer in flight. It
// returns at once for a token that was never armed or is already settled.
//
// It returns an error wrapping ctx.Err() when ctx ends first.
func (f *Fences[K]) LeaseSettled(ctx context.Context, token Token) error {
	for {
		// Taking the channel under the same lock as the check registers
		// interest before it: a settle that lands after the check closes
		// the very channel waited on below, so it cannot be missed.
		f.gateMu.Lock()
		ch, ok := f.pending[token]
		f.gateMu.Unlock()
		if !ok {
			return nil
		}
		if f.leaseWaitHook != nil {
			f.leaseWaitHook(token)
		}
		select {
		case <-ch:
			// Settled; check again, since the token may have been re-armed
			// for a later lease before this waiter ran.
		case <-ctx.Done():
			return fmt.Errorf("fence: waiting for the lease of token %s: %w", token, ctx.Err())
		}
	}
}
