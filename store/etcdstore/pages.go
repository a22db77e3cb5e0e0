package etcdstore

import (
	"encoding/binary"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
)

// firstPage is how many entries the first range read of a byte-bounded
// page asks for; later reads ask for as many as the bytes left fit at the
// average size read so far (at most readPage). etcd bounds a range in
// keys, not bytes, so this is how a page stays near its byte bound.
const firstPage = 16

var _ store.PageReader = (*Store)(nil)

// ReadPage implements store.PageReader: ReadFrom that also stops before the
// entry that would bring the payload bytes past maxBytes (always returning
// the entry at offset when there is one). Committed entries are read with
// etcd range reads sized from the bytes left, staged ones copied from
// memory. An offset below the stream's first stored entry fails with a
// *store.CompactedError.
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
	n := uint64(readPage)
	if maxBytes > 0 {
		n = firstPage
	}
	prefix := s.lay.entryPrefix(c.name, name)
	for from := offset; from < min(end, committed); {
		to := min(end, committed, from+n)
		ctx, cancel := s.ctx()
		resp, err := s.kv.Get(ctx, entryKey(prefix, from), clientv3.WithRange(entryKey(prefix, to)))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("etcdstore: read %q from %d: %w", name, from, err)
		}
		for i, kv := range resp.Kvs {
			seq := from + uint64(i)
			if string(kv.Key) != entryKey(prefix, seq) {
				return nil, s.missing(c.name, name, offset, seq)
			}
			payload, err := s.unseal(string(kv.Key), kv.Value)
			if err != nil {
				return nil, err
			}
			if full(len(payload)) {
				return out, nil
			}
			size += len(payload)
			out = append(out, store.Entry{Seq: seq, Payload: payload})
		}
		if uint64(len(resp.Kvs)) != to-from {
			return nil, s.missing(c.name, name, offset, from+uint64(len(resp.Kvs)))
		}
		from = to
		if maxBytes > 0 {
			if size >= maxBytes {
				break
			}
			avg := max(size/len(out), 1)
			n = uint64(min(max((maxBytes-size)/avg+1, 1), readPage))
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
// (the stream's first stored entry is past it), else ErrCorrupt.
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
// etcd, 0 when it has none. A trim never removes a stream's last
// committed entry, so a stream with entries always has a first key.
func (s *Store) loadFirst(sc, name string) (uint64, error) {
	prefix := s.lay.entryPrefix(sc, name)
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.kv.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("etcdstore: read the first entry of %q: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	k := resp.Kvs[0].Key
	if len(k) != len(prefix)+8 {
		return 0, fmt.Errorf("%w: stream %q has a malformed entry key %q", ErrCorrupt, name, k)
	}
	return binary.BigEndian.Uint64(k[len(prefix):]), nil
}
