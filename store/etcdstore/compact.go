package etcdstore

import (
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
)

var _ store.Compactor = (*Store)(nil)

// byteValue is a byte value with a write staged or in flight. Guarded by
// Store.mu.
type byteValue struct {
	cur   []byte // nil: deleted; never modified once set
	gen   uint64 // advances at every PutBytes of the key
	taken uint64 // the gen of the last write a commit took
}

// Trim implements store.Compactor. The trim is staged like an append:
// visible at once (First is below, reads under it are refused as
// compacted) and committed by the next Flush, in the scope's transaction,
// as one DeleteRange of the stream's runs below the run holding below
// (found here, by one read) and a put of the stream's floor key, fenced
// like every write of the scope and compared so that it commits only
// while that run is stored (the stream keeps its last entry whatever
// happened). A run straddling the floor stays whole; the floor key keeps
// its entries below the floor compacted. Seqs never move.
func (s *Store) Trim(name string, below uint64) error {
	if err := checkName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		c, st, first, err := s.firstLocked(name)
		if err != nil {
			return err
		}
		if below <= first {
			return nil
		}
		if below >= st.committed {
			return fmt.Errorf("trim %q below %d with %d flushed entries: %w", name, below, st.committed, store.ErrTrimRange)
		}
		if s.opts.RequireFence && c.name != "" && !c.fenced {
			return fmt.Errorf("%w: %q", ErrNotFenced, c.name)
		}
		epoch := c.epoch
		s.mu.Unlock()
		run, err := s.runAt(c.name, name, below)
		s.mu.Lock()
		if err != nil {
			return err
		}
		if c2, err := s.usableLocked(name); err != nil {
			return err
		} else if c2 != c || c.epoch != epoch || c.streams[name] != st || below <= st.first {
			// Reset, or trimmed meanwhile: decide again.
			continue
		}
		st.first = below
		st.trimTo, st.trimRun = below, run
		c.logLocked(write{name: name, trim: st, u64: below, run: run})
		// Counted like an append, so that a Flush waits for it (a scope
		// whose only write is a trim is pending too).
		c.staged++
		return nil
	}
}

// runAt returns the first seq of the run of stream name (of scope sc) that
// holds seq, a committed entry: the run at or below it.
func (s *Store) runAt(sc, name string, seq uint64) (uint64, error) {
	prefix := s.lay.entryPrefix(sc, name)
	ctx, cancel := s.ctx()
	resp, err := s.kv.Get(ctx, prefix, clientv3.WithRange(entryKey(prefix, seq+1)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		return 0, fmt.Errorf("etcdstore: find the run of %q holding %d: %w", name, seq, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, s.missing(sc, name, seq, seq)
	}
	return runSeq(prefix, resp.Kvs[0].Key)
}

// First implements store.Compactor: the floor of the last trim staged or
// committed by this store, else the stream's floor key or its first run
// stored in etcd, whichever is later (0 for a stream that has none: a
// trim keeps a stream's last entry).
func (s *Store) First(name string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _, first, err := s.firstLocked(name)
	return first, err
}

// firstLocked returns the scope and state of stream name and its first
// stored seq, reading it from etcd the first time. It may release and
// retake s.mu, as streamLocked.
func (s *Store) firstLocked(name string) (*scope, *stream, uint64, error) {
	for {
		c, err := s.usableLocked(name)
		if err != nil {
			return nil, nil, 0, err
		}
		c, st, err := s.streamLocked(c, name)
		if err != nil {
			return nil, nil, 0, err
		}
		if st.firstKnown {
			return c, st, st.first, nil
		}
		s.mu.Unlock()
		first, err := s.loadFirst(c.name, name)
		s.mu.Lock()
		if err != nil {
			return nil, nil, 0, err
		}
		// A reset meanwhile replaced the stream's state: read it again.
		if c2 := s.scopes[c.name]; c2 == c && c.streams[name] == st && !st.firstKnown {
			st.first, st.firstKnown = first, true
		}
	}
}

// PutBytes implements store.Compactor. The values are staged like CAS
// writes: visible at once, committed by the next Flush in their scopes'
// transactions, fenced, and each compared so that it commits only if etcd's
// copy was not modified since this store last loaded or committed the
// scope (another writer's value is never silently overwritten; the scope
// fails with ErrConflict instead). A value must fit one etcd request, as
// an Append's payload does (MaxPayloadLen). Nothing is staged when any
// value is refused.
func (s *Store) PutBytes(values []store.Bytes) error {
	for _, v := range values {
		if err := checkName(v.Key); err != nil {
			return err
		}
		if len(v.Value) > s.maxPayload {
			return fmt.Errorf("byte value %q of %d bytes, at most %d fit an etcd request: %w", v.Key, len(v.Value), s.maxPayload, store.ErrTooLarge)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Every scope written must be usable and loaded (its revision known)
	// in one hold of s.mu, so that nothing is staged unless all can be.
	for ready := false; !ready; {
		ready = true
		for _, v := range values {
			c, err := s.usableLocked(v.Key)
			if err != nil {
				return err
			}
			if s.opts.RequireFence && c.name != "" && !c.fenced {
				return fmt.Errorf("%w: %q", ErrNotFenced, c.name)
			}
			if !c.loaded {
				if _, err := s.loadedLocked(c, v.Key); err != nil {
					return err
				}
				ready = false // s.mu was released: check every scope again
			}
		}
	}
	for _, v := range values {
		c, _ := s.usableLocked(v.Key)
		bv := c.bytes[v.Key]
		if bv == nil {
			bv = &byteValue{}
			c.bytes[v.Key] = bv
		}
		bv.cur = nil
		if len(v.Value) > 0 {
			bv.cur = append([]byte(nil), v.Value...)
		}
		bv.gen++
		c.logLocked(write{name: v.Key, bv: bv, val: bv.cur, gen: bv.gen})
		c.staged++
	}
	return nil
}

// GetBytes implements store.Compactor: a staged or in-flight value, else a
// linearizable read of etcd (a checkpoint read after a failover must be
// the newest one).
func (s *Store) GetBytes(key string) ([]byte, error) {
	s.mu.Lock()
	c, err := s.readableLocked(key)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if bv := c.bytes[key]; bv != nil {
		v := append([]byte(nil), bv.cur...)
		s.mu.Unlock()
		if len(v) == 0 {
			return nil, nil
		}
		return v, nil
	}
	sc := c.name
	s.mu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	k := s.lay.bytesKey(sc, key)
	resp, err := s.kv.Get(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: read byte value %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	v, err := s.unseal(k, resp.Kvs[0].Value)
	if err != nil || len(v) == 0 {
		return nil, err
	}
	return v, nil
}
