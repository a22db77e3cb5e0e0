package stage

import (
	"sync"
	"time"

	"github.com/participantd/participantd/store"
)

// Batch is one group commit: every Flush waiting on it gets its error.
type Batch struct {
	done chan struct{}
	err  error // written before done is closed
	// taken is closed once the batch's writes are taken (TakeLocked), or
	// once it is finished without having been (Run's close): a write
	// staged after that goes to a later batch.
	taken chan struct{}
	// takenAt is when the batch was taken for writing (zero if it never
	// was); finishedAt when it was finished. Both are written before done
	// is closed, takenAt under the engine's mutex.
	takenAt, finishedAt time.Time
}

// NewBatch returns a batch nobody has taken or finished.
func NewBatch() *Batch { return &Batch{done: make(chan struct{}), taken: make(chan struct{})} }

// Taken returns a channel closed once the batch no longer takes writes:
// its writes were taken for writing, or it was finished unwritten.
func (b *Batch) Taken() <-chan struct{} { return b.taken }

// Finish records err as the outcome of the batch and wakes every waiter.
// It is called exactly once, without the engine's mutex held.
func (b *Batch) Finish(err error) {
	b.err = err
	b.finishedAt = time.Now()
	close(b.done)
}

// Wait blocks until the batch is finished and returns its error.
func (b *Batch) Wait() error {
	<-b.done
	return b.err
}

// Timing returns how the time of a Flush that began at start and waited
// for b divides (store.FlushTiming): until b was taken, then until it was
// finished. It is called after Wait.
func (b *Batch) Timing(start time.Time) store.FlushTiming {
	taken := b.takenAt
	if taken.IsZero() || taken.Before(start) {
		// Taken before the Flush began (a Flush that waited for the
		// batch in flight), or never: no group wait.
		taken = start
	}
	if b.finishedAt.Before(taken) {
		return store.FlushTiming{}
	}
	return store.FlushTiming{Wait: taken.Sub(start), Write: b.finishedAt.Sub(taken)}
}

// Group is the group-commit state of one store: the batch in flight, and
// the next one, which every Flush arriving meanwhile joins. Its fields are
// guarded by the engine's mutex.
type Group struct {
	// kick wakes the committer when a Flush waits for the next batch. It
	// has capacity 1 so that wakes coalesce and senders never block.
	kick chan struct{}
	// next is the batch that will carry the staged writes, created by the
	// first Flush that waits for it; inflight is the batch being written.
	next     *Batch
	inflight *Batch
}

// NewGroup returns a group with no batch.
func NewGroup() *Group { return &Group{kick: make(chan struct{}, 1)} }

// JoinLocked returns the batch a Flush waits for: the next one when the
// caller has writes staged (creating it, and reporting that the committer
// must be woken, when it is the first to wait), else the batch in flight,
// else nil, and the Flush returns at once. The caller releases its mutex
// and then calls Wait.
func (g *Group) JoinLocked(staged bool) (bt *Batch, wake bool) {
	switch {
	case staged:
		if g.next == nil {
			g.next = NewBatch()
			wake = true
		}
		return g.next, wake
	case g.inflight != nil:
		return g.inflight, false
	}
	return nil, false
}

// Wait is the end of a Flush that joined bt: it wakes the committer when
// wake is set and waits for bt. A nil bt is a Flush with nothing to wait
// for. It is called without the engine's mutex held.
func (g *Group) Wait(bt *Batch, wake bool) error {
	if bt == nil {
		return nil
	}
	if wake {
		g.Kick()
	}
	return bt.Wait()
}

// Kick wakes the committer; a wake already pending absorbs it.
func (g *Group) Kick() {
	select {
	case g.kick <- struct{}{}:
	default: // a wake is already pending; it will find the next batch
	}
}

// IdleLocked reports whether no batch is waiting or in flight: a Flush
// may then write its batch itself (StartLocked) instead of handing it to
// the committer.
func (g *Group) IdleLocked() bool { return g.next == nil && g.inflight == nil }

// BusyLocked reports whether a batch is being written.
func (g *Group) BusyLocked() bool { return g.inflight != nil }

// WaitingLocked reports whether a Flush waits for the next batch.
func (g *Group) WaitingLocked() bool { return g.next != nil }

// TakeLocked returns the next batch, nil when none, and makes it the batch
// in flight: writes staged from now on go to the batch after it. The
// caller takes its staged writes in the same critical section, writes
// them, then calls EndLocked and, with its mutex released, Finish.
func (g *Group) TakeLocked() *Batch {
	bt := g.next
	g.next = nil
	g.inflight = bt
	if bt != nil {
		bt.takenAt = time.Now()
		close(bt.taken)
	}
	return bt
}

// StartLocked returns a new batch in flight for a Flush that writes it
// itself; the group must be idle (IdleLocked).
func (g *Group) StartLocked() *Batch {
	if !g.IdleLocked() {
		panic("stage: StartLocked on a busy group")
	}
	g.inflight = NewBatch()
	g.inflight.takenAt = time.Now()
	close(g.inflight.taken)
	return g.inflight
}

// EndLocked records that the batch in flight was written, or failed; the
// caller then finishes it with the outcome, its mutex released.
func (g *Group) EndLocked() { g.inflight = nil }

// Run is the committer loop: it calls commit once per wake until quit is
// closed, then fails the next batch, if a Flush waits for one, with
// store.ErrClosed. mu is the engine's mutex, which commit takes itself.
func (g *Group) Run(mu sync.Locker, quit <-chan struct{}, commit func()) {
	for {
		select {
		case <-g.kick:
			commit()
		case <-quit:
			mu.Lock()
			bt := g.next
			g.next = nil
			if bt != nil {
				close(bt.taken)
			}
			mu.Unlock()
			if bt != nil {
				bt.Finish(store.ErrClosed)
			}
			return
		}
	}
}

// DropFront returns payloads without its first n, which a commit made
// durable. The payloads staged after the commit began are copied into a
// fresh slice, so that the durable prefix is not kept alive behind them;
// nil when nothing is left.
func DropFront(payloads [][]byte, n int) [][]byte {
	if len(payloads) == n {
		return nil
	}
	return append([][]byte(nil), payloads[n:]...)
}
