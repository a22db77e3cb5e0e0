package logfirst

import (
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/wal"
)

// replayer applies replayed records to bbolt in transactions of about
// defaultReplayCheckpointSize bytes, each storing the LSN it reached, so
// that a crash during a replay resumes where it stopped.
type replayer struct {
	db      *bolt.DB
	lsn     wal.LSN // the last LSN in bbolt
	pending []*wal.Batch
	size    int
}

func (r *replayer) add(b *wal.Batch) error {
	r.pending = append(r.pending, b)
	for _, a := range b.Appends {
		for _, p := range a.Payloads {
			r.size += len(p) + entryOverhead
		}
	}
	r.size += len(b.Values) * entryOverhead
	if r.size >= defaultReplayCheckpointSize {
		return r.flush()
	}
	return nil
}

func (r *replayer) flush() error {
	if len(r.pending) == 0 {
		return nil
	}
	last := r.pending[len(r.pending)-1].LSN
	err := r.db.Update(func(tx *bolt.Tx) error {
		for _, b := range r.pending {
			for _, a := range b.Appends {
				if err := store.PutEntries(tx, a.Stream, a.First, a.Payloads); err != nil {
					return fmt.Errorf("record %v: %w", b.LSN, err)
				}
			}
			for _, v := range b.Values {
				if err := store.PutValue(tx, v.Key, v.Value); err != nil {
					return fmt.Errorf("record %v: %w", b.LSN, err)
				}
			}
		}
		return putCheckpointLSN(tx, last)
	})
	if err != nil {
		return err
	}
	r.lsn, r.pending, r.size = last, nil, 0
	return nil
}

// replayIntoMemory applies a replayed record to the logged layer of a
// read-only store, as a commit would have.
func (s *Store) replayIntoMemory(b *wal.Batch) error {
	for _, a := range b.Appends {
		st, err := s.lockStream(a.Stream)
		if err != nil {
			return err
		}
		have := st.lenLocked()
		if have != a.First {
			s.mu.Unlock()
			return fmt.Errorf("record %v: stream %q has %d entries, record starts at %d", b.LSN, a.Stream, have, a.First)
		}
		st.logged = append(st.logged, a.Payloads...)
		s.mu.Unlock()
	}
	s.mu.Lock()
	for _, v := range b.Values {
		s.gen++
		s.values[v.Key] = valueState{v: v.Value, gen: s.gen}
	}
	s.lastLSN = b.LSN
	s.mu.Unlock()
	return nil
}
