package participant

import (
	"context"
	"sync"
)

// byteBudget is a counting semaphore in bytes: reconciliations take the
// budget of a page before they read it and give it back once the page is
// consumed, so that the pages in flight across every concurrent
// reconciliation never exceed its capacity. Waiters are served in arrival
// order, so a large request is not starved by a stream of small ones.
type byteBudget struct {
	capacity int64

	// mu guards the fields below.
	mu sync.Mutex
	// +checklocks:mu
	used int64
	// +checklocks:mu
	waiters []*budgetWaiter
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed once the bytes are granted
}

func newByteBudget(capacity int64) *byteBudget {
	return &byteBudget{capacity: max(capacity, 1)}
}

// acquire takes n bytes (at most the capacity), waiting until they are
// free or ctx ends; it returns the bytes taken, which the caller must
// release. On ctx's end it takes nothing and returns ctx's error.
func (b *byteBudget) acquire(ctx context.Context, n int64) (int64, error) {
	n = min(max(n, 1), b.capacity)
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.capacity {
		b.used += n
		b.mu.Unlock()
		return n, nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return n, nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.ready:
			// Granted while ctx ended: give it back.
			b.used -= n
		default:
			for i, x := range b.waiters {
				if x == w {
					b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
					break
				}
			}
		}
		b.grantLocked()
		b.mu.Unlock()
		return 0, ctx.Err()
	}
}

// release gives back n bytes that acquire returned.
func (b *byteBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		panic("participant: byte budget released more than it granted")
	}
	b.grantLocked()
	b.mu.Unlock()
}

// grantLocked grants waiters in order while the first one fits. b.mu must
// be held.
//
// +checklocks:b.mu
func (b *byteBudget) grantLocked() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.capacity {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.used += w.n
		close(w.ready)
	}
}
