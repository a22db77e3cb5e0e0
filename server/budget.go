package server

import "sync"

// budget is a number of bytes that goroutines take before holding that much
// memory and give back when they let it go. Waiting is by channel, so a
// waiter can also watch for its connection's end.
type budget struct {
	limit int64

	// mu guards used and freed.
	mu sync.Mutex
	// +checklocks:mu
	used int64
	// freed is closed, and replaced, when bytes are given back while
	// someone waits (watched: a tryTake returned it since it was made).
	// +checklocks:mu
	freed chan struct{}
	// +checklocks:mu
	watched bool
}

func newBudget(limit int64) *budget {
	return &budget{limit: limit, freed: make(chan struct{})}
}

// tryTake takes n bytes if they fit. When they do not, it returns a channel
// closed at the next release, so that no release is missed between the
// attempt and the wait.
func (b *budget) tryTake(n int64) (ok bool, wait <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		b.watched = true
		return false, b.freed
	}
	b.used += n
	return true, nil
}

// give returns n bytes taken earlier and wakes the waiters.
func (b *budget) give(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.watched {
		close(b.freed)
		b.freed, b.watched = make(chan struct{}), false
	}
	b.mu.Unlock()
}

// inUse returns the bytes taken.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// taker is a budget that take can take from: a budget, or a holder of a
// shared one.
type taker interface {
	tryTake(n int64) (ok bool, wait <-chan struct{})
	give(n int64)
}

// take takes n bytes of every budget in bs, waiting while any lacks room.
// It returns false, having taken nothing, if stop or quit (either may be
// nil) is closed first. Callers keep n within every limit (Config
// validation sees to it), so a wait always ends once the holders give back.
func take(n int64, stop, quit <-chan struct{}, bs ...taker) bool {
	return takeOr(n, stop, quit, nil, bs...)
}

// takeOr is take that calls beforeWait, if not nil, each time before it
// waits for room.
func takeOr(n int64, stop, quit <-chan struct{}, beforeWait func(), bs ...taker) bool {
	for {
		var wait <-chan struct{}
		i := 0
		for ; i < len(bs); i++ {
			var ok bool
			if ok, wait = bs[i].tryTake(n); !ok {
				break
			}
		}
		if i == len(bs) {
			return true
		}
		for _, b := range bs[:i] {
			b.give(n)
		}
		if beforeWait != nil {
			beforeWait()
		}
		select {
		case <-wait:
		case <-stop:
			return false
		case <-quit:
			return false
		}
	}
}
