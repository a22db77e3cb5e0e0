package logfirst

import (
	"fmt"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
)

// Trim implements store.Compactor. The trim is staged like a write: it is
// visible at once (reads below the new first fail with a
// *store.CompactedError), goes into the next log record, and is applied to
// bbolt by the checkpoint of that record, after the record's appends. Only
// logged entries count as flushed; below must leave the last of them. It
// returns the sticky error after a failure and ErrReadOnly on a read-only
// store.
func (s *Store) Trim(name string, below uint64) error {
	if s.readOnly {
		return ErrReadOnly
	}
	st, err := s.lockStream(name)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if below <= st.first {
		return nil
	}
	if flushed := st.base + uint64(len(st.logged)); below >= flushed {
		return fmt.Errorf("trim %q below %d with %d flushed entries: %w", name, below, flushed, store.ErrTrimRange)
	}
	st.first = below
	s.stagedTrims[name] = below
	return nil
}

// First implements store.Compactor: the first seq not trimmed, counting
// staged trims.
func (s *Store) First(name string) (uint64, error) {
	st, err := s.lockStream(name)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return st.first, nil
}

// PutBytes implements store.Compactor: the values are staged like writes,
// visible at once and durable with the next record. It returns the
// sticky error after a failure and ErrReadOnly on a read-only store.
func (s *Store) PutBytes(values []store.Bytes) error {
	if err := store.CheckBytes(values); err != nil {
		return err
	}
	if s.readOnly {
		return ErrReadOnly
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	for _, v := range values {
		s.gen++
		bs := bytesState{gen: s.gen}
		if len(v.Value) > 0 {
			bs.v = append([]byte(nil), v.Value...)
		}
		s.bytes[v.Key] = bs
		s.stagedBytes[v.Key] = bs
	}
	return nil
}

// GetBytes implements store.Compactor: a value written since its last
// checkpoint comes from memory, any other from bbolt.
func (s *Store) GetBytes(key string) ([]byte, error) {
	s.mu.Lock()
	if err := s.usableLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if bs, ok := s.bytes[key]; ok {
		s.mu.Unlock()
		if bs.v == nil {
			return nil, nil
		}
		return append([]byte(nil), bs.v...), nil
	}
	s.mu.Unlock()
	// Absent from memory, the key's value is in bbolt; a write made and
	// checkpointed meanwhile is a later write, which a concurrent read may
	// or may not see.
	var out []byte
	err := s.view(func(tx *bolt.Tx) error {
		var err error
		out, err = boltfmt.GetBytesTx(tx, key)
		return err
	})
	if err != nil {
		return nil, s.readErr(err)
	}
	return out, nil
}

// hasStagedLocked reports whether any write is staged for the next
// record. s.mu must be held.
func (s *Store) hasStagedLocked() bool {
	return s.streams.DirtyLocked() || s.vals.StagedLocked() || len(s.stagedTrims) > 0 || len(s.stagedBytes) > 0
}

// applyTrims deletes, in tx, the entries each trim covers, in key order.
func applyTrims(tx *bolt.Tx, trims map[string]uint64) error {
	for _, name := range slices.SortedFunc(maps.Keys(trims), compareKeyOrder) {
		if err := boltfmt.TrimEntries(tx, name, trims[name]); err != nil {
			return err
		}
	}
	return nil
}

// sortedBytes returns byte values in key order, deletions as empty
// values.
func sortedBytes(m map[string]bytesState) []store.Bytes {
	out := make([]store.Bytes, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, store.Bytes{Key: k, Value: m[k].v})
	}
	return out
}
