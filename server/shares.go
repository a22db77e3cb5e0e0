package server

import (
	"cmp"
	"slices"
	"sync"
)

// Shares of the server's byte budgets (docs/DESIGN.md, Threat model,
// "Shares of the server-wide budgets"). A server-wide budget (pending
// request bytes, queued outbound bytes) protects the process; its shares
// protect the clients from one another. Every connection takes from it for
// a holder: its principal (conn.principal: the client certificate's
// identity, else the peer's address prefix), or, for a connection acting
// for nobody (loopback, exempt by default), the connection itself.
//
//   - A holder may hold at most its share: ClientShare percent of the
//     budget (at least one frame). Past it only that holder's connections
//     wait.
//   - Above highWater (80 %) of the budget, a holder that holds more than
//     small (a twentieth of the budget, at least one frame) waits too: the
//     largest holders are refused first, so the rest of the budget admits
//     the holders that hold little.
//   - When the budget is full and a holder that holds less cannot take,
//     the holders that hold the most are refused instead of it waiting:
//     what of theirs can be given up at once (a frame whose body is still
//     arriving; an outbound queue its peer does not read) is cut, largest
//     holder first, until what the taker needs is freed.
//
// So one principal stalls nobody else however many connections it opens,
// and many principals that fill the budget between them are cut before a
// holder that holds less waits behind them.
type sharedBudget struct {
	// The rules are fixed at creation. share is the most one principal
	// may hold; small is what a holder may hold and still take above
	// highWater.
	limit     int64 // +checklocksignore: read-only
	share     int64 // +checklocksignore: read-only
	small     int64 // +checklocksignore: read-only
	highWater int64 // +checklocksignore: read-only

	// mu guards the fields below.
	mu sync.Mutex
	// +checklocks:mu
	used int64
	// freed is closed, and replaced, when bytes are given back while
	// someone waits (watched: a tryTake returned it since it was made).
	// +checklocks:mu
	freed chan struct{}
	// +checklocks:mu
	watched bool
	// named are the holders of principals, by name.
	// +checklocks:mu
	named map[string]*holder
	// active are the holders that hold bytes, the candidates to be cut.
	// +checklocks:mu
	active map[*holder]struct{}
	// cutting are the holdings cut and not yet given back, with their
	// bytes, and cuttingBytes their sum: what is already on its way back
	// is not cut for again.
	// +checklocks:mu
	cutting map[cutter]int64
	// +checklocks:mu
	cuttingBytes int64
}

// holder is what one principal (or one connection acting for nobody)
// holds of a sharedBudget; its fields are guarded by the budget's mu.
type holder struct {
	b *sharedBudget
	// name is the principal's, "" for a connection's own holder.
	name string
	// share is the most it may hold: the budget's share, or the whole
	// budget for a connection's own holder (its connection budget bounds
	// it).
	share int64
	held  int64
	// refs counts the connections of a named holder.
	refs int
	// cuttable are the holdings that can be given up at once.
	cuttable map[cutter]struct{}
}

// cutter is a holding that can be given up at once: cut ends it, and its
// owner gives its bytes back when it sees the end. size is what it holds,
// read under the budget's mu (an atomic: its owner changes it without).
type cutter interface {
	cut()
	size() int64
}

// newSharedBudget returns a budget of limit bytes shared out by share
// percent, where no take is larger than frame.
func newSharedBudget(limit int64, sharePercent int, frame int64) *sharedBudget {
	return &sharedBudget{
		limit:     limit,
		share:     min(limit, max(frame, limit*int64(sharePercent)/100)),
		small:     min(limit, max(frame, limit/20)),
		highWater: limit * 8 / 10,
		freed:     make(chan struct{}),
		named:     make(map[string]*holder),
		active:    make(map[*holder]struct{}),
		cutting:   make(map[cutter]int64),
	}
}

// join returns the holder of principal name, counting one more connection
// of it; "" returns a holder of the caller's own. Each join is undone by
// one leave.
func (b *sharedBudget) join(name string) *holder {
	b.mu.Lock()
	defer b.mu.Unlock()
	if name == "" {
		return &holder{b: b, share: b.limit, refs: 1, cuttable: make(map[cutter]struct{})}
	}
	h := b.named[name]
	if h == nil {
		h = &holder{b: b, name: name, share: b.share, cuttable: make(map[cutter]struct{})}
		b.named[name] = h
	}
	h.refs++
	return h
}

// leave counts one connection of h less; h is forgotten when none is left
// (what it holds is given back by then).
func (h *holder) leave() {
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	h.refs--
	if h.refs == 0 && h.name != "" && b.named[h.name] == h {
		delete(b.named, h.name)
	}
}

// inUse returns the bytes taken.
func (b *sharedBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// tryTake takes n bytes for h if its share and the budget's rules let it
// (see sharedBudget). When they do not, it returns a channel closed at the
// next release; if the budget is full and holders that hold more than h
// can give some up, it cuts them first.
func (h *holder) tryTake(n int64) (bool, <-chan struct{}) {
	b := h.b
	b.mu.Lock()
	if h.held+n <= h.share && b.used+n <= b.limit && (b.used+n <= b.highWater || h.held+n <= b.small) {
		b.used += n
		h.held += n
		b.active[h] = struct{}{}
		b.mu.Unlock()
		return true, nil
	}
	wait := b.freed
	b.watched = true
	var cut []cutter
	if h.held+n <= h.share && b.used+n > b.limit {
		cut = b.victimsLocked(h, n, b.used+n-b.limit-b.cuttingBytes)
	}
	b.mu.Unlock()
	for _, c := range cut {
		c.cut()
	}
	return false, wait
}

// victimsLocked picks, largest holder first, the cuttable holdings of the
// holders that hold more than h would with n more, until need bytes are
// picked, and forgets
// them (their owners give the bytes back when they see the cut).
//
// +checklocks:b.mu
func (b *sharedBudget) victimsLocked(h *holder, n, need int64) []cutter {
	var big []*holder
	for o := range b.active {
		if o != h && len(o.cuttable) > 0 && o.held > h.held+n {
			big = append(big, o)
		}
	}
	slices.SortFunc(big, func(x, y *holder) int { return cmp.Compare(y.held, x.held) })
	var out []cutter
	for _, o := range big {
		for c := range o.cuttable {
			if need <= 0 {
				return out
			}
			size := c.size()
			if size <= 0 {
				continue
			}
			out = append(out, c)
			need -= size
			delete(o.cuttable, c)
			b.cutting[c] = size
			b.cuttingBytes += size
		}
	}
	return out
}

// give gives back n bytes h took and wakes the waiters.
func (h *holder) give(n int64) {
	if n == 0 {
		return
	}
	b := h.b
	b.mu.Lock()
	b.used -= n
	h.held -= n
	if h.held == 0 {
		delete(b.active, h)
	}
	if b.watched {
		close(b.freed)
		b.freed, b.watched = make(chan struct{}), false
	}
	b.mu.Unlock()
}

// mayCut records that c holds bytes of h that it can give up at once,
// until unmayCut.
func (h *holder) mayCut(c cutter) {
	h.b.mu.Lock()
	h.cuttable[c] = struct{}{}
	h.b.mu.Unlock()
}

// unmayCut records that c no longer holds bytes it can give up at once:
// its holding became a request, or is about to be given back. It is
// called before the bytes are given back.
func (h *holder) unmayCut(c cutter) {
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(h.cuttable, c)
	if n, ok := b.cutting[c]; ok {
		delete(b.cutting, c)
		b.cuttingBytes -= n
	}
}
