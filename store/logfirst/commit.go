package logfirst

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/internal/stage"
	"github.com/participantd/participantd/store/wal"
)

// Flush implements store.DurableStore with group commit: Seal, then its
// wait. A Flush with writes staged when no record is being written writes
// the record itself (sparing a lone writer two goroutine hand-offs per
// flush); otherwise it joins the next record, which the committer writes
// once the current one is done and which carries the writes of every
// Flush that arrived before it was taken. A Flush with nothing staged
// waits only for a record being written, and returns nil at once when
// there is none. After a failure Flush returns the sticky error (wrapping
// store.ErrFailed); after Close, store.ErrClosed.
func (s *Store) Flush() error {
	_, err := s.sealAndWait()
	return err
}

// FlushTimed implements store.TimedFlusher: Flush, with how long it waited
// for the record that carries its writes to be taken and how long that
// record's write and sync took.
func (s *Store) FlushTimed() (store.FlushTiming, error) {
	start := time.Now()
	bt, err := s.sealAndWait()
	if bt == nil {
		return store.FlushTiming{}, err
	}
	return bt.Timing(start), err
}

// sealAndWait seals the writes staged and waits for the record carrying
// them; the record is nil when there was nothing to wait for, or the seal
// failed.
func (s *Store) sealAndWait() (*stage.Batch, error) {
	bt, err := s.seal()
	if err != nil || bt == nil {
		return nil, err
	}
	return bt, bt.Wait()
}

// Seal implements store.Sealer: records are written one at a time, in
// order, each only once the one before it is durable (and none after a
// failure), so a write staged once the record carrying the sealed writes
// is taken goes into a later record. Seal with writes staged returns once
// the record that carries them is taken: at once when no record is being
// written, as Flush would, after writing it itself (so the wait returns at
// once); else when the committer takes the next record, which it does as
// soon as the one in flight is durable. With nothing staged it waits for
// nothing, and the wait waits, as Flush does, for a record being written.
// Errors are Flush's: returned at once when known (a sticky failure,
// Close, or the record Seal wrote itself), else by the wait.
func (s *Store) Seal() (wait func() error, err error) {
	bt, err := s.seal()
	switch {
	case err != nil:
		return nil, err
	case bt == nil:
		return func() error { return nil }, nil
	}
	return bt.Wait, nil
}

// seal is Seal, returning the record to wait for (nil: none) instead of
// its wait, so that Flush waits without a closure: the record it wrote
// itself, already finished with the error returned; or the next record,
// once taken, when writes are staged; or the record being written.
func (s *Store) seal() (*stage.Batch, error) {
	s.mu.Lock()
	if err := s.usableLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.flushes.Add(1)
	staged := s.hasStagedLocked()
	if staged && s.group.IdleLocked() && s.memBytes < s.opts.MaxUncheckpointed {
		bt := s.group.StartLocked()
		s.commitAndUnlock(bt)
		return bt, bt.Wait()
	}
	bt, wake := s.group.JoinLocked(staged)
	s.mu.Unlock()
	if bt == nil {
		return nil, nil
	}
	if wake {
		s.group.Kick()
	}
	if staged {
		<-bt.Taken()
	}
	return bt, nil
}

// KeepsOrder implements store.Ordered: a crash leaves a prefix of the
// writes. Every write is staged in the order it returned, a commit takes
// all that is staged into one record, records are written and synced one
// at a time, and a start replays them in order, up to a torn tail at
// most. A torn tail is what a torn write of the last record leaves; a
// damaged record, the last included, is refused, never cut (the log's
// segment format 2 stamps and checks each sector of a record: store/wal,
// "Torn or damaged"). So a batch's oplog and outbox rows may share one
// record, the last of the log, and one sync (docs/DESIGN.md, "One sync
// for both barriers"; participant TestBitFlip_TheLastLogRecordOfAnAnsweredTell).
func (s *Store) KeepsOrder() bool { return true }

// runCommitter is the committer goroutine: one log record per wake.
func (s *Store) runCommitter() {
	defer s.done.Done()
	s.group.Run(&s.mu, s.quit, s.commit)
}

// taken is the part of one stream a commit or checkpoint carries.
type taken struct {
	name     string
	st       *stream
	first    uint64
	payloads [][]byte // never modified
}

// commit writes s.next as one log record, once no other record is being
// written and memory allows. Only the committer calls it.
func (s *Store) commit() {
	s.mu.Lock()
	// One record at a time, in order; and memory for logged batches is
	// bounded: while it is full, the record waits for a checkpoint, and so
	// does every Flush.
	for (s.group.BusyLocked() || s.memBytes >= s.opts.MaxUncheckpointed) && s.usableLocked() == nil {
		if s.memBytes >= s.opts.MaxUncheckpointed {
			s.kickCheckpointer()
		}
		s.memFreed.Wait()
	}
	bt := s.group.TakeLocked()
	if bt == nil {
		s.mu.Unlock()
		return
	}
	if err := s.usableLocked(); err != nil {
		s.group.EndLocked()
		s.mu.Unlock()
		bt.Finish(err)
		return
	}
	s.commitAndUnlock(bt)
}

// commitAndUnlock writes every staged write as one log record and finishes bt
// with the result. s.mu must be held and bt in flight in s.group
// (TakeLocked or StartLocked), which makes the caller the only writer of
// the log; it returns with s.mu released and bt finished.
func (s *Store) commitAndUnlock(bt *stage.Batch) {
	// Everything staged now goes into this record; writes staged from here
	// on wait for the next one. Each stream's pending payloads are taken
	// as a prefix and moved to logged only after the record is durable.
	streams := make([]taken, 0, s.streams.DirtyCountLocked())
	s.streams.TakeDirtyLocked(func(name string, st *stream) {
		n := len(st.pending)
		streams = append(streams, taken{name: name, st: st, first: st.base + uint64(len(st.logged)), payloads: st.pending[:n:n]})
	})
	values := s.vals.TakeStagedLocked()
	trims := s.stagedTrims
	s.stagedTrims = make(map[string]uint64)
	byteValues := s.stagedBytes
	s.stagedBytes = make(map[string]bytesState)
	s.mu.Unlock()

	var lsn wal.LSN
	var err error
	var size int64
	if len(streams) > 0 || len(values) > 0 || len(trims) > 0 || len(byteValues) > 0 {
		rec := &wal.Batch{Appends: make([]wal.StreamAppend, len(streams)), Values: make([]wal.ValueWrite, 0, len(values))}
		slices.SortFunc(streams, func(x, y taken) int { return strings.Compare(x.name, y.name) })
		for i, t := range streams {
			rec.Appends[i] = wal.StreamAppend{Stream: t.name, First: t.first, Payloads: t.payloads}
			for _, p := range t.payloads {
				size += int64(len(p)) + entryOverhead
			}
		}
		for _, k := range slices.Sorted(maps.Keys(values)) {
			rec.Values = append(rec.Values, wal.ValueWrite{Key: k, Value: values[k].Value})
			size += int64(len(k)) + entryOverhead
		}
		for _, name := range slices.Sorted(maps.Keys(trims)) {
			rec.Trims = append(rec.Trims, wal.StreamTrim{Stream: name, Below: trims[name]})
			size += int64(len(name)) + entryOverhead
		}
		for _, k := range slices.Sorted(maps.Keys(byteValues)) {
			rec.Bytes = append(rec.Bytes, wal.BytesWrite{Key: k, Value: byteValues[k].v})
			size += int64(len(k)+len(byteValues[k].v)) + entryOverhead
		}
		// The record is durable when Append returns nil: only then may any
		// Flush it carries return.
		lsn, err = s.log.Append(rec)
	}

	s.mu.Lock()
	s.group.EndLocked()
	switch {
	case err != nil:
		s.failLocked(fmt.Errorf("%w: log %s: %w", store.ErrFailed, s.dir, err))
		err = s.err
	case lsn != 0:
		for _, t := range streams {
			n := len(t.payloads)
			t.st.logged = append(t.st.logged, t.payloads...)
			t.st.pending = stage.DropFront(t.st.pending, n)
			s.logged[t.name] = t.st
		}
		for k, vs := range values {
			s.loggedValues[k] = vs
		}
		for name, below := range trims {
			s.loggedTrims[name] = max(s.loggedTrims[name], below)
		}
		for k, bs := range byteValues {
			s.loggedBytes[k] = bs
		}
		s.memBytes += size
		s.lastLSN = lsn
		s.commits.Add(1)
		if s.checkpointDueLocked() {
			s.kickCheckpointer()
		}
	}
	// Wakes the committer if it waits for this record, and Close.
	s.memFreed.Broadcast()
	s.mu.Unlock()
	if err != nil {
		s.syncFailed()
	}
	bt.Finish(err)
}

// syncFailed marks the data directory for the next Open after a failed
// log write (see SyncFailedFile; a bbolt commit is made under the marker).
func (s *Store) syncFailed() {
	if err := markSyncFailed(s.opts.fs(), s.dir); err != nil {
		s.logger.Error().Err(err).Msg("marking the failed sync for the next start")
	}
}

// entryOverhead is what memory accounting charges per entry or value
// beyond its bytes: slice and map headers.
const entryOverhead = 48

// failLocked sets the sticky error and wakes everything waiting for
// memory. s.mu must be held.
func (s *Store) failLocked(err error) {
	if s.err == nil {
		s.err = err
	}
	s.memFreed.Broadcast()
}

// checkpointDueLocked reports whether CheckpointBytes of logged writes
// wait for a checkpoint that has not taken them. The bytes a running
// checkpoint took do not count: counting them queued the next checkpoint
// as soon as they and the writes logged meanwhile reached the bound, so
// that under a steady load checkpoints ran back to back, each of what one
// checkpoint's duration let in, and each paid again what a checkpoint
// costs whatever its size (the marker file, the transaction, each
// stream's length check, two fdatasyncs). s.mu must be held.
func (s *Store) checkpointDueLocked() bool {
	return s.memBytes-s.ckTaken >= s.opts.CheckpointBytes
}

func (s *Store) kickCheckpointer() {
	select {
	case s.ckKick <- struct{}{}:
	default:
	}
}

// runCheckpointer is the checkpointer goroutine: it applies the logged
// batches to bbolt CheckpointInterval after the last checkpoint ended, or
// sooner when kicked. The interval restarts at each checkpoint's end, so
// that a checkpoint the bytes started is not followed by one of the few
// logged until a tick that was already due.
func (s *Store) runCheckpointer() {
	defer s.done.Done()
	t := time.NewTimer(s.opts.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.ckKick:
		case <-s.quit:
			return
		}
		if err := s.checkpoint(); err != nil {
			s.logger.Error().Err(err).Msg("checkpoint failed; the store refuses every call")
		}
		// A timer's Reset discards a tick not yet received (Go 1.23).
		t.Reset(s.opts.CheckpointInterval)
	}
}

// checkpoint applies every logged batch to bbolt in one transaction that
// also records the last applied LSN, then forgets them from memory and
// removes the log segments they alone needed. Only one checkpoint runs at
// a time (ckMu): the checkpointer's, Backup's, or Close's.
func (s *Store) checkpoint() error {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	s.mu.Lock()
	if s.err != nil || s.lastLSN == s.ckLSN {
		s.mu.Unlock()
		return nil
	}
	// The logged layer is exactly the batches up to lastLSN: a commit
	// moves a whole batch into it under mu.
	streams := make([]taken, 0, len(s.logged))
	for name, st := range s.logged {
		n := len(st.logged)
		streams = append(streams, taken{name: name, st: st, first: st.base, payloads: st.logged[:n:n]})
	}
	clear(s.logged)
	values := s.loggedValues
	s.loggedValues = make(map[string]stage.Write)
	trims := s.loggedTrims
	s.loggedTrims = make(map[string]uint64)
	byteValues := s.loggedBytes
	s.loggedBytes = make(map[string]bytesState)
	lsn, freed := s.lastLSN, s.memBytes
	s.ckTaken = freed
	s.mu.Unlock()

	// Entries go in in key order: bbolt inserts into a node by copying its
	// tail, so random order over a big transaction is quadratic.
	slices.SortFunc(streams, func(x, y taken) int { return compareKeyOrder(x.name, y.name) })
	// The LSN is stored in the transaction that applies the batches, so
	// that bbolt never holds a batch without knowing it does. Trims go
	// after the appends: a trim covers only entries of records before its
	// own, all of which this transaction or an earlier one applies.
	err := s.update(func(tx *bolt.Tx) error {
		for _, t := range streams {
			// Every logged payload came from Append, which left room
			// for its checksum, or from a replay (capped, so copied).
			if err := boltfmt.PutOwnedEntries(tx, t.name, t.first, t.payloads); err != nil {
				return err
			}
		}
		for _, k := range slices.Sorted(maps.Keys(values)) {
			if err := boltfmt.PutValue(tx, k, values[k].Value); err != nil {
				return err
			}
		}
		if err := applyTrims(tx, trims); err != nil {
			return err
		}
		if err := boltfmt.PutBytesTx(tx, sortedBytes(byteValues)); err != nil {
			return err
		}
		return putCheckpointLSN(tx, lsn)
	})

	s.mu.Lock()
	s.ckTaken = 0
	if err != nil {
		s.failLocked(fmt.Errorf("%w: checkpoint to %s: %w", store.ErrFailed, s.db.Path(), err))
		err = s.err
		s.mu.Unlock()
		return err
	}
	for _, t := range streams {
		n := len(t.payloads)
		t.st.base += uint64(n)
		t.st.logged = stage.DropFront(t.st.logged, n)
	}
	s.vals.LandLocked(values)
	for k, bs := range byteValues {
		if s.bytes[k].gen == bs.gen {
			delete(s.bytes, k)
		}
	}
	// Batches logged since the snapshot stay counted; every byte counted
	// when it was taken is now in bbolt.
	s.memBytes -= freed
	s.ckLSN = lsn
	s.checkpoints.Add(1)
	s.memFreed.Broadcast()
	s.mu.Unlock()

	if err := s.log.RemoveBelow(lsn); err != nil {
		if errors.Is(err, wal.ErrDirSync) {
			// The log refuses every append from here: so does the store.
			s.mu.Lock()
			s.failLocked(fmt.Errorf("%w: log %s: %w", store.ErrFailed, s.dir, err))
			err = s.err
			s.mu.Unlock()
			return err
		}
		// The segments stay and are skipped by replay; the next
		// checkpoint tries again.
		s.logger.Warn().Err(err).Msg("removing checkpointed log segments")
	}
	return nil
}

// Close implements store.DurableStore: it stops the committer, waiting for
// a record being written, fails the flushes waiting for a later one with
// store.ErrClosed, discards staged writes, checkpoints what was logged (so
// that the next Open replays nothing), and closes the log and bbolt. After
// a failure it still releases the files and returns the sticky error.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.memFreed.Broadcast()
	// A Flush may be writing a record itself: the log stays open until it
	// is done. No new one starts once closed is set.
	for s.group.BusyLocked() {
		s.memFreed.Wait()
	}
	s.mu.Unlock()

	var err error
	if !s.readOnly {
		close(s.quit)
		s.done.Wait()
		err = s.checkpoint()
	}
	// A Backup that began before closed was set finishes first.
	s.filesMu.Lock()
	defer s.filesMu.Unlock()
	if !s.readOnly {
		if cerr := s.log.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("logfirst: close: %w", cerr)
		}
	}
	s.endShared(true) // bbolt's Close waits for every read transaction
	if cerr := s.db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("logfirst: close %s: %w", s.db.Path(), cerr)
	}
	s.mu.Lock()
	sticky := s.err
	s.streams.ReleaseLocked()
	s.logged, s.loggedValues = nil, nil
	s.vals.ReleaseLocked()
	s.bytes, s.stagedBytes, s.loggedBytes, s.stagedTrims, s.loggedTrims = nil, nil, nil, nil, nil
	s.mu.Unlock()
	if sticky != nil {
		return sticky
	}
	return err
}
