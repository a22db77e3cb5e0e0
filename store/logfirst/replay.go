package logfirst

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/wal"
)

// replayer applies replayed records to bbolt in transactions of about
// defaultReplayCheckpointSize bytes, each storing the LSN it reached, so
// that a crash during a replay resumes where it stopped. Within a
// transaction it merges the records per stream and per key and writes in
// key order: bbolt inserts into a node by copying its tail, so random
// order over a big transaction is quadratic.
//
// bbolt's checkpoint LSN never goes back: a replay that adds no record
// writes nothing, since the log's records at or below the checkpoint may
// already be removed, and a lower LSN would have the next Open find a gap
// or apply them twice.
type replayer struct {
	// update commits a transaction to bbolt: Store.update, so that a
	// replay commits as a checkpoint does (vfs.Commit, boltfmt.Contain).
	update  func(func(*bolt.Tx) error) error
	lsn     wal.LSN // the last LSN in bbolt
	last    wal.LSN // the last LSN added; lsn until a record is
	streams map[string]*wal.StreamAppend
	values  map[string]uint64
	trims   map[string]uint64
	bytes   map[string]bytesState
	size    int
}

// newReplayer returns a replayer of the records after ck, bbolt's
// checkpoint LSN, committing with update.
func newReplayer(update func(func(*bolt.Tx) error) error, ck wal.LSN) *replayer {
	return &replayer{update: update, lsn: ck, last: ck}
}

func (r *replayer) add(b *wal.Batch) error {
	if r.streams == nil {
		r.streams, r.values = map[string]*wal.StreamAppend{}, map[string]uint64{}
		r.trims, r.bytes = map[string]uint64{}, map[string]bytesState{}
	}
	for _, a := range b.Appends {
		st := r.streams[a.Stream]
		switch {
		case st == nil:
			r.streams[a.Stream] = &wal.StreamAppend{Stream: a.Stream, First: a.First, Payloads: slices.Clip(a.Payloads)}
		case st.First+uint64(len(st.Payloads)) != a.First:
			return fmt.Errorf("record %v: stream %q continues at %d, record starts at %d", b.LSN, a.Stream, st.First+uint64(len(st.Payloads)), a.First)
		default:
			st.Payloads = append(st.Payloads, a.Payloads...)
		}
		for _, p := range a.Payloads {
			r.size += len(p) + entryOverhead
		}
	}
	for _, v := range b.Values {
		r.values[v.Key] = v.Value
		r.size += len(v.Key) + entryOverhead
	}
	for _, t := range b.Trims {
		r.trims[t.Stream] = max(r.trims[t.Stream], t.Below)
		r.size += len(t.Stream) + entryOverhead
	}
	for _, v := range b.Bytes {
		r.bytes[v.Key] = bytesState{v: v.Value}
		r.size += len(v.Key) + len(v.Value) + entryOverhead
	}
	r.last = b.LSN
	if r.size >= defaultReplayCheckpointSize {
		return r.flush()
	}
	return nil
}

func (r *replayer) flush() error {
	if r.last == r.lsn {
		return nil
	}
	streams := slices.SortedFunc(maps.Values(r.streams), func(x, y *wal.StreamAppend) int {
		return compareKeyOrder(x.Stream, y.Stream)
	})
	err := r.update(func(tx *bolt.Tx) error {
		for _, a := range streams {
			if err := boltfmt.PutEntries(tx, a.Stream, a.First, a.Payloads); err != nil {
				return fmt.Errorf("replay to LSN %v: %w", r.last, err)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(r.values)) {
			if err := boltfmt.PutValue(tx, k, r.values[k]); err != nil {
				return fmt.Errorf("replay to LSN %v: %w", r.last, err)
			}
		}
		// As in a checkpoint, trims go after the appends they may cover.
		if err := applyTrims(tx, r.trims); err != nil {
			return fmt.Errorf("replay to LSN %v: %w", r.last, err)
		}
		if err := boltfmt.PutBytesTx(tx, sortedBytes(r.bytes)); err != nil {
			return fmt.Errorf("replay to LSN %v: %w", r.last, err)
		}
		return putCheckpointLSN(tx, r.last)
	})
	if err != nil {
		return err
	}
	r.lsn, r.streams, r.values, r.trims, r.bytes, r.size = r.last, nil, nil, nil, nil, 0
	return nil
}

// compareKeyOrder orders stream names as their entry keys sort in bbolt:
// by length (the key's 2-byte length prefix), then bytes.
func compareKeyOrder(x, y string) int {
	if c := cmp.Compare(len(x), len(y)); c != 0 {
		return c
	}
	return strings.Compare(x, y)
}

// replayIntoMemory applies a replayed record to the logged layer of a
// read-only store, as a commit would have.
func (s *Store) replayIntoMemory(b *wal.Batch) error {
	for _, a := range b.Appends {
		st, err := s.lockStream(a.Stream)
		if err != nil {
			return err
		}
		have := st.LenLocked()
		if have != a.First {
			s.mu.Unlock()
			return fmt.Errorf("record %v: stream %q has %d entries, record starts at %d", b.LSN, a.Stream, have, a.First)
		}
		for _, p := range a.Payloads {
			// Capped: the bytes past a payload are the next record's, and
			// a checkpoint seals in place what has room (PutOwnedEntries).
			st.logged = append(st.logged, p[:len(p):len(p)])
		}
		s.mu.Unlock()
	}
	for _, t := range b.Trims {
		st, err := s.lockStream(t.Stream)
		if err != nil {
			return err
		}
		st.first = max(st.first, t.Below)
		s.mu.Unlock()
	}
	s.mu.Lock()
	for _, v := range b.Values {
		s.vals.WriteLocked(v.Key, v.Value)
	}
	for _, v := range b.Bytes {
		s.gen++
		s.bytes[v.Key] = bytesState{v: v.Value, gen: s.gen}
	}
	s.lastLSN = b.LSN
	s.mu.Unlock()
	return nil
}
