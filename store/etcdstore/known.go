package etcdstore

import (
	"fmt"
	"hash/maphash"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Value reads served from memory. Every operation that carries a token
// reads its index entry before it commits, and for a new token (nearly
// every one) the entry is absent. A scope loaded under its claim (exact,
// see scope.exact) is written by this store alone, so the store can know
// which of its value keys exist: the load lists them (keys only), and each
// commit of the scope adds the values it wrote. A key the filter has never
// seen is absent in etcd, and its read is answered 0 without a request;
// any other read goes to etcd as before.
//
// The filter is a Bloom filter (about 10 bits and 7 probes per key, grown
// by segments of twice the size when one fills), so it may say "maybe"
// for a key it never saw (then etcd answers) but never "absent" for one it
// saw. Deleted values stay in it until the scope reloads. Its memory is
// bounded in bytes, per scope (maxFilterBytes) and for the store
// (Options.MaxFilterBytes): a scope whose filter would pass either drops
// it and reads every value from etcd until it reloads.

const (
	// filterBitsPerKey and filterProbes give a false "maybe" about one
	// read in a hundred.
	filterBitsPerKey = 10
	filterProbes     = 7
	// filterMinKeys is the capacity of a scope's first segment.
	filterMinKeys = 1024
	// maxFilterBytes bounds one scope's filter.
	maxFilterBytes = 1 << 20
	// DefaultMaxFilterBytes bounds the filters of every scope of a store.
	DefaultMaxFilterBytes = 64 << 20
)

// keyFilter is one scope's set of value names that may exist in etcd.
// Guarded by Store.mu.
type keyFilter struct {
	seed maphash.Seed
	segs []filterSeg
}

// filterSeg is one segment: a bit set of cap*filterBitsPerKey bits holding
// n keys.
type filterSeg struct {
	bits []uint64
	n    int
	cap  int
}

func newFilterSeg(keys int) filterSeg {
	words := (keys*filterBitsPerKey + 63) / 64
	return filterSeg{bits: make([]uint64, words), cap: keys}
}

// bytes returns the memory the segment's bits take.
func (g *filterSeg) bytes() int { return 8 * len(g.bits) }

func (g *filterSeg) probe(h uint64, set bool) bool {
	m := uint64(len(g.bits) * 64)
	h1, h2 := h, h>>33|1
	for i := range uint64(filterProbes) {
		b := (h1 + i*h2) % m
		w, bit := b/64, uint64(1)<<(b%64)
		if set {
			g.bits[w] |= bit
		} else if g.bits[w]&bit == 0 {
			return false
		}
	}
	return true
}

// mayHold reports whether name may be a value key of the scope in etcd;
// false means it is not.
func (f *keyFilter) mayHold(name string) bool {
	h := maphash.String(f.seed, name)
	for i := range f.segs {
		if f.segs[i].probe(h, false) {
			return true
		}
	}
	return false
}

// add records name, growing the filter by a segment when the last one is
// full; it returns the bytes the filter grew by.
func (f *keyFilter) add(name string) int {
	grew := 0
	last := &f.segs[len(f.segs)-1]
	if last.n >= last.cap {
		f.segs = append(f.segs, newFilterSeg(2*last.cap))
		last = &f.segs[len(f.segs)-1]
		grew = last.bytes()
	}
	last.probe(maphash.String(f.seed, name), true)
	last.n++
	return grew
}

// size returns the memory the filter's bits take.
func (f *keyFilter) size() int {
	n := 0
	for i := range f.segs {
		n += f.segs[i].bytes()
	}
	return n
}

// newKeyFilter returns a filter holding names, with room for as many more.
func newKeyFilter(seed maphash.Seed, names []string) *keyFilter {
	f := &keyFilter{seed: seed, segs: []filterSeg{newFilterSeg(max(filterMinKeys, 2*len(names)))}}
	for _, n := range names {
		f.add(n)
	}
	return f
}

// loadValueNames lists the names of every value of scope sc (keys only),
// and returns the revision the listing began at.
func (s *Store) loadValueNames(sc string) ([]string, int64, error) {
	prefix := s.lay.valueKey(sc, "")
	var names []string
	var rev int64
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		ctx, cancel := s.ctx()
		resp, err := s.kv.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(4096), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return nil, 0, fmt.Errorf("etcdstore: list the values of scope %q: %w", sc, err)
		}
		if rev == 0 {
			// The first page's revision: everything read is at least as new.
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			names = append(names, string(kv.Key[len(prefix):]))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return names, rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// setFilterLocked installs f as c's filter if the store's budget has room
// for it.
func (s *Store) setFilterLocked(c *scope, f *keyFilter) {
	s.dropFilterLocked(c)
	if f == nil || f.size() > maxFilterBytes || s.filterBytes+f.size() > s.opts.MaxFilterBytes {
		return
	}
	c.known = f
	s.filterBytes += f.size()
}

// dropFilterLocked forgets c's filter: its reads go to etcd.
func (s *Store) dropFilterLocked(c *scope) {
	if c.known != nil {
		s.filterBytes -= c.known.size()
		c.known = nil
	}
}

// knownLocked records that value name of c exists in etcd (a commit wrote
// it), dropping c's filter when it would pass its bounds.
func (s *Store) knownLocked(c *scope, name string) {
	if c.known == nil {
		return
	}
	grew := c.known.add(name)
	s.filterBytes += grew
	if c.known.size() > maxFilterBytes || s.filterBytes > s.opts.MaxFilterBytes {
		s.dropFilterLocked(c)
	}
}

// absentLocked reports whether value name of c is known to be absent in
// etcd (c's filter never saw it), counting the read it saves.
func (s *Store) absentLocked(c *scope, name string) bool {
	if c.known == nil || !c.exact || c.known.mayHold(name) {
		return false
	}
	s.memReads.Add(1)
	return true
}
