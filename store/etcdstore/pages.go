package etcdstore

import (
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
)

// firstRuns is how many runs the first forward range read of a
// byte-bounded page asks for; later reads ask for as many as the bytes
// left fit at the average run size read so far (at most readPage). etcd
// bounds a range in keys, not bytes, so this is how a page stays near its
// byte bound.
const firstRuns = 4

var _ store.PageReader = (*Store)(nil)

// ReadPage implements store.PageReader: ReadFrom that also stops before the
// entry that would bring the payload bytes past maxBytes (always returning
// the entry at offset when there is one). Committed entries are read with
// etcd range reads of whole runs: the run holding offset (one descending
// range limited to one key), then the runs after it in ranges sized from
// the bytes left; staged ones are copied from memory. An offset below the
// stream's first entry (a staged trim's floor, or the floor key read with
// the first run) fails with a *store.CompactedError.
func (s *Store) ReadPage(name string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	s.mu.Lock()
	c, err := s.usableLocked(name)
	if err == nil {
		c, _, err = s.streamLocked(c, name)
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	st := c.streams[name]
	committed, pending := st.committed, st.pending
	first, firstKnown := st.first, st.firstKnown
	s.mu.Unlock()

	if firstKnown && offset < first {
		return nil, &store.CompactedError{Stream: name, Offset: offset, First: first}
	}
	total := committed + uint64(len(pending))
	if offset >= total {
		return nil, nil
	}
	end := total
	if limit > 0 && uint64(limit) < end-offset {
		end = offset + uint64(limit)
	}
	var out []store.Entry
	size := 0
	// full reports that the next entry, of n bytes, does not fit the page.
	full := func(n int) bool { return maxBytes > 0 && len(out) > 0 && size+n > maxBytes }
	hi := min(end, committed)
	prefix := s.lay.entryPrefix(c.name, name)
	// take adds the entries of the run at f that fall in [offset, hi); it
	// reports false once the page is full.
	take := func(f uint64, ents [][]byte) bool {
		for i, p := range ents {
			seq := f + uint64(i)
			if seq < offset || seq >= hi {
				continue
			}
			if full(len(p)) {
				return false
			}
			size += len(p)
			out = append(out, store.Entry{Seq: seq, Payload: append([]byte(nil), p...)})
		}
		return true
	}
	// run reads the run at kv, which must start at want (any start at or
	// below offset for the first), and returns the seq after it.
	run := func(kv *mvccpb.KeyValue, want uint64, first bool) (uint64, []([]byte), error) {
		f, err := runSeq(prefix, kv.Key)
		if err != nil {
			return 0, nil, err
		}
		if (first && f > want) || (!first && f != want) {
			return 0, nil, s.missing(c.name, name, offset, want)
		}
		ents, err := s.openRun(string(kv.Key), kv.Value)
		if err != nil {
			return 0, nil, err
		}
		next := f + uint64(len(ents))
		if next <= want {
			return 0, nil, s.missing(c.name, name, offset, want)
		}
		return next, ents, nil
	}
	from := offset
	if from < hi {
		// The run holding offset and, beside it, the stream's floor: a
		// run straddling a floor (this store's trim or another's) holds
		// entries below it, which are compacted all the same.
		fk := s.lay.floorKey(c.name, name)
		resps, err := s.gets([]get{{fk, nil}, {prefix, []clientv3.OpOption{clientv3.WithRange(entryKey(prefix, offset+1)),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1)}}})
		if err != nil {
			return nil, fmt.Errorf("etcdstore: read %q from %d: %w", name, from, err)
		}
		if fl := resps[0].Kvs; len(fl) > 0 {
			floor, err := s.unsealU64(fk, fl[0].Value)
			if err != nil {
				return nil, fmt.Errorf("etcdstore: stream floor: %w", err)
			}
			if offset < floor {
				return nil, &store.CompactedError{Stream: name, Offset: offset, First: max(floor, first)}
			}
		}
		resp := resps[1]
		if len(resp.Kvs) == 0 {
			return nil, s.missing(c.name, name, offset, offset)
		}
		next, ents, err := run(resp.Kvs[0], offset, true)
		if err != nil {
			return nil, err
		}
		if !take(next-uint64(len(ents)), ents) {
			return out, nil
		}
		from = next
	}
	runs, read := 0, 0 // runs and bytes read after the first, to size ranges
	for from < hi {
		if maxBytes > 0 && size >= maxBytes {
			break
		}
		n := int64(min(uint64(readPage), hi-from))
		if maxBytes > 0 {
			n = min(n, firstRuns)
			if runs > 0 {
				avg := max(read/runs, 1)
				n = min(int64(max((maxBytes-size)/avg+1, 1)), int64(min(uint64(readPage), hi-from)))
			}
		}
		ctx, cancel := s.ctx()
		resp, err := s.kv.Get(ctx, entryKey(prefix, from), clientv3.WithRange(entryKey(prefix, hi)), clientv3.WithLimit(n))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("etcdstore: read %q from %d: %w", name, from, err)
		}
		if len(resp.Kvs) == 0 {
			return nil, s.missing(c.name, name, offset, from)
		}
		for _, kv := range resp.Kvs {
			next, ents, err := run(kv, from, false)
			if err != nil {
				return nil, err
			}
			runs, read = runs+1, read+len(kv.Value)
			if !take(from, ents) {
				return out, nil
			}
			from = next
		}
	}
	for seq := max(offset, committed); seq < end; seq++ {
		p := pending[seq-committed]
		if full(len(p)) {
			break
		}
		size += len(p)
		out = append(out, store.Entry{Seq: seq, Payload: append([]byte(nil), p...)})
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// missing returns the error of a read from offset that found entry seq of
// a committed range absent: a *store.CompactedError when a trim removed it
// (the stream's first entry is past it), else ErrCorrupt.
func (s *Store) missing(sc, name string, offset, seq uint64) error {
	first, err := s.loadFirst(sc, name)
	if err != nil {
		return err
	}
	if first > seq {
		return &store.CompactedError{Stream: name, Offset: offset, First: first}
	}
	return fmt.Errorf("%w: stream %q entry %d is missing", ErrCorrupt, name, seq)
}

// loadFirst reads the seq of the first entry of stream name stored in
// etcd, 0 when it has none: its floor key (written by a trim) or the first
// seq of its first run, whichever is later. A trim never removes a
// stream's last committed entry, so a stream with entries always has a
// first run.
func (s *Store) loadFirst(sc, name string) (uint64, error) {
	resps, err := s.gets(s.firstGets(sc, name))
	if err != nil {
		return 0, fmt.Errorf("etcdstore: read the first entry of %q: %w", name, err)
	}
	return s.parseFirst(sc, name, resps[0], resps[1])
}

// firstGets are the reads loadFirst makes: the stream's floor key and its
// first run's key.
func (s *Store) firstGets(sc, name string) []get {
	prefix := s.lay.entryPrefix(sc, name)
	return []get{
		{s.lay.floorKey(sc, name), nil},
		{prefix, []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(1), clientv3.WithKeysOnly()}},
	}
}

// parseFirst returns the first entry of stream name from the answers to
// firstGets.
func (s *Store) parseFirst(sc, name string, floor, run *clientv3.GetResponse) (uint64, error) {
	if len(run.Kvs) == 0 {
		return 0, nil
	}
	first, err := runSeq(s.lay.entryPrefix(sc, name), run.Kvs[0].Key)
	if err != nil {
		return 0, fmt.Errorf("etcdstore: stream %q: %w", name, err)
	}
	if len(floor.Kvs) > 0 {
		f, err := s.unsealU64(s.lay.floorKey(sc, name), floor.Kvs[0].Value)
		if err != nil {
			return 0, fmt.Errorf("etcdstore: stream floor: %w", err)
		}
		first = max(first, f)
	}
	return first, nil
}
