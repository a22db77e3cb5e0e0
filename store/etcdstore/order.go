package etcdstore

import (
	"fmt"

	"github.com/participantd/participantd/store"
)

// A scope's writes keep their order across a crash (doc.go, Order). Its
// log records them as they are staged, in the order their calls
// returned, and is the one record of what the scope staged: a commit
// gathers from it what it writes of the scope (gatherLocked), in one
// transaction when that fits one; a scope that does not is cut into
// transactions along its log, and those run one after the other, none
// after one that failed. What etcd holds of the scope after any failure
// is then its writes up to a cut: a prefix.

// write is one staged write of a scope, as its log records it: an
// append of n entries to a stream (st), a CAS of a value (v, to u64), a
// trim (trim, below u64 in the run starting at run) or a byte value
// (bv, to val). gen is the value's or byte value's count after the write.
type write struct {
	name string
	st   *stream
	n    int
	v    *value
	trim *stream
	bv   *byteValue
	u64  uint64
	run  uint64
	val  []byte
	gen  uint64
}

// logAppendLocked logs an append of one entry to stream st (name),
// adding it to the log's last write when that is an append to st.
func (c *scope) logAppendLocked(name string, st *stream) {
	if n := len(c.log); n > 0 && c.log[n-1].st == st {
		c.log[n-1].n++
		return
	}
	c.logLocked(write{name: name, st: st, n: 1})
}

// maxLogHint bounds the writes a scope's new log has room for.
const maxLogHint = 64

// logLocked records w at the end of the scope's log. A new log has room
// for as many writes as the last commit took (at most maxLogHint), so
// that a scope staging alike batches allocates its log once per commit,
// and an idle scope holds none.
func (c *scope) logLocked(w write) {
	if c.log == nil {
		c.log = make([]write, 0, min(max(c.logHint, 1), maxLogHint))
	}
	c.log = append(c.log, w)
}

// gatherLocked sets what the commit sw writes of each stream, value, trim
// and byte value its log names, once each and in the order of their first
// writes, with what the scope staged of it last: all of a stream's
// pending entries (the log holds every append since the scope's last
// commit began, and that commit wrote the entries before them), a
// value's and a byte value's last write, a stream's last trim. Store.mu
// must be held.
//
// Each is gathered at its first write in the log and marked taken, so
// that its later writes are passed over: a stream by its taken entries
// (none before: no commit of the scope is in flight when one takes it),
// a value and a byte value by the gen of the write taken, a trim by
// clearing the stream's staged floor.
func (sw *scopeWork) gatherLocked() {
	for _, w := range sw.log {
		switch {
		case w.st != nil:
			if st := w.st; st.taken == 0 {
				st.taken = len(st.pending)
				sw.streams = append(sw.streams, &streamWork{st: st, name: w.name, base: st.committed, ents: st.pending[:st.taken]})
			}
		case w.v != nil:
			if v := w.v; v.taken != v.gen {
				v.taken = v.gen
				sw.values = append(sw.values, &valueWork{v: v, name: w.name, old: v.committed, new: v.cur, gen: v.gen})
			}
		case w.trim != nil:
			if st := w.trim; st.trimTo != 0 {
				sw.trims = append(sw.trims, &trimWork{name: w.name, below: st.trimTo, run: st.trimRun})
				st.trimTo = 0
			}
		case w.bv != nil:
			if bv := w.bv; bv.taken != bv.gen {
				bv.taken = bv.gen
				sw.bytes = append(sw.bytes, &bytesWork{bv: bv, name: w.name, val: bv.cur, gen: bv.gen})
			}
		}
	}
}

// packInOrder lays sw out as transactions of consecutive stretches of its
// log, appended to plans. Within a transaction a stretch's writes are
// gathered as one commit would gather them (a stream's entries as one
// chunk, a value's or byte value's last write, a stream's last trim):
// the transaction is atomic, so their order within it does not matter.
// A value or byte value written in two stretches is written by both
// transactions, each with what the stretch left it.
//
// sw.values, sw.trims and sw.bytes are replaced by the writes of the
// plans, in log order, so that the commit's outcome is applied in that
// order (applyLocked).
//
// It fails only when a stream's appends in the log do not add up to the
// entries the commit took of it, which would be a bug of the store: the
// scope then fails rather than commit its writes out of order.
func (s *Store) packInOrder(sw *scopeWork, plans []*txnPlan) ([]*txnPlan, error) {
	kept := plans
	works := make(map[*stream]*streamWork, len(sw.streams))
	for _, swk := range sw.streams {
		works[swk.st] = swk
	}
	// olds are the values' committed values when the commit was taken.
	olds := make(map[*value]uint64, len(sw.values))
	for _, vw := range sw.values {
		olds[vw.v] = vw.old
	}
	sw.values, sw.trims, sw.bytes = sw.values[:0], sw.trims[:0], sw.bytes[:0]

	var (
		cur *txnPlan
		// Per transaction: the item of each stream's chunk (an index into
		// cur.items), and each value's, trim's and byte value's write.
		chunks map[*stream]int
		runs   map[*stream]int // the bytes of the chunk's last run
		vals   map[*value]*valueWork
		trims  map[*stream]*trimWork
		bytes  map[*byteValue]*bytesWork
		// Across the transactions: how many entries of each stream are
		// laid out, and the plan that last wrote each byte value.
		laid     = make(map[*stream]int, len(works))
		lastPlan = make(map[*byteValue]*txnPlan)
	)
	fenceCmp, fenceBytes := 0, 0
	if sw.fence != nil {
		fenceCmp, fenceBytes = 1, kvCost(sw.fence.Key, 16)
	}
	start := func() {
		if cur != nil && len(cur.items) > 0 {
			plans = append(plans, cur)
		}
		cur = s.newPlan()
		cur.has[sw] = true
		if sw.fence != nil {
			cur.items = append(cur.items, item{sw: sw, fence: true})
			cur.cmps, cur.bytes = fenceCmp, fenceBytes
		}
		chunks, runs = make(map[*stream]int), make(map[*stream]int)
		vals, trims, bytes = make(map[*value]*valueWork), make(map[*stream]*trimWork), make(map[*byteValue]*bytesWork)
	}
	// room makes room in cur for a write costing c compares, p puts and
	// b bytes, starting a new transaction if cur has writes and lacks
	// it. It reports whether a new one was started.
	room := func(c, p, b int) bool {
		if s.fits(cur, c, p, b) || len(cur.items) == fenceCmp {
			return false
		}
		start()
		return true
	}
	start()
	for _, w := range sw.log {
		switch {
		case w.st != nil:
			swk := works[w.st]
			if laid[w.st]+w.n > len(swk.ents) {
				return kept, fmt.Errorf("%w: etcdstore: scope %q logged more appends to %q than its commit took", store.ErrFailed, sw.sc.name, w.name)
			}
			prefix := s.lay.entryPrefix(sw.sc.name, swk.name)
			head := kvCost(prefix, 8+runOverhead)
			for range w.n {
				i := laid[w.st]
				e := entryCost(len(swk.ents[i]))
				if at, ok := chunks[w.st]; ok {
					// The chunk's next entry: in its last run, or a run
					// of its own past MaxRunBytes.
					p, b := 0, e
					if runOverhead+runs[w.st]+e > s.opts.MaxRunBytes {
						p, b = 1, e+head
					}
					if !room(0, p, b) {
						cur.items[at].n++
						cur.puts += p
						cur.bytes += b
						if p > 0 {
							runs[w.st] = 0
						}
						runs[w.st] += e
						laid[w.st]++
						continue
					}
				}
				c := s.valueCmps(sw)
				room(c, 1, 2*head+e)
				chunks[w.st] = len(cur.items)
				runs[w.st] = e
				cur.items = append(cur.items, item{sw: sw, swk: swk, from: i, n: 1})
				cur.cmps += c
				cur.puts++
				cur.bytes += 2*head + e
				laid[w.st]++
			}
		case w.v != nil:
			if vw := vals[w.v]; vw != nil {
				vw.new, vw.gen = w.u64, w.gen
				olds[w.v] = w.u64
				continue
			}
			key := s.lay.valueKey(sw.sc.name, w.name)
			c := s.valueCmps(sw)
			room(c, 1, 2*kvCost(key, 8))
			vw := &valueWork{v: w.v, name: w.name, old: olds[w.v], new: w.u64, gen: w.gen}
			olds[w.v] = w.u64 // where the next stretch's write starts from
			vals[w.v] = vw
			sw.values = append(sw.values, vw)
			cur.items = append(cur.items, item{sw: sw, vw: vw})
			cur.cmps += c
			cur.puts++
			cur.bytes += 2 * kvCost(key, 8)
		case w.trim != nil:
			if tw := trims[w.trim]; tw != nil {
				tw.below, tw.run = w.u64, w.run
				continue
			}
			tw := &trimWork{name: w.name, below: w.u64, run: w.run}
			c, p, b := s.trimCost(sw, tw)
			room(c, p, b)
			trims[w.trim] = tw
			sw.trims = append(sw.trims, tw)
			cur.items = append(cur.items, item{sw: sw, tw: tw})
			cur.cmps, cur.puts, cur.bytes = cur.cmps+c, cur.puts+p, cur.bytes+b
		case w.bv != nil:
			if bw := bytes[w.bv]; bw != nil {
				// The last write of the stretch wins; a longer value
				// than the transaction can take starts a new one.
				_, _, was := s.bytesCost(sw, bw)
				next := &bytesWork{bv: w.bv, name: w.name, val: w.val, gen: w.gen}
				_, _, now := s.bytesCost(sw, next)
				if now <= was || s.fits(cur, 0, 0, now-was) {
					bw.val, bw.gen = w.val, w.gen
					cur.bytes += now - was
					continue
				}
			}
			bw := &bytesWork{bv: w.bv, name: w.name, val: w.val, gen: w.gen}
			c, p, b := s.bytesCost(sw, bw)
			room(c, p, b)
			bw.after = lastPlan[w.bv]
			lastPlan[w.bv] = cur
			bytes[w.bv] = bw
			sw.bytes = append(sw.bytes, bw)
			cur.items = append(cur.items, item{sw: sw, bw: bw})
			cur.cmps, cur.puts, cur.bytes = cur.cmps+c, cur.puts+p, cur.bytes+b
		}
	}
	for st, swk := range works {
		if laid[st] != len(swk.ents) {
			return kept, fmt.Errorf("%w: etcdstore: scope %q logged %d appends to %q, its commit took %d", store.ErrFailed, sw.sc.name, laid[st], swk.name, len(swk.ents))
		}
	}
	if len(cur.items) > fenceCmp {
		plans = append(plans, cur)
	}
	return plans, nil
}

// KeepsOrderWithin implements store.ScopeOrdered: the writes of one scope
// keep their order across a crash, those of different scopes do not.
func (s *Store) KeepsOrderWithin(names ...string) bool {
	for i := 1; i < len(names); i++ {
		if s.lay.scopeOf(names[i]) != s.lay.scopeOf(names[0]) {
			return false
		}
	}
	return true
}

var _ store.ScopeOrdered = (*Store)(nil)
