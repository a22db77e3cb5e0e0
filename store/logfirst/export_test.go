package logfirst

import (
	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/wal"
)

// abandon stops the store as a crash would: the goroutines stop, nothing
// more is checkpointed, and the files are released as they are.
func (s *Store) abandon() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.memFreed.Broadcast()
	for s.group.BusyLocked() {
		s.memFreed.Wait()
	}
	s.mu.Unlock()
	if !s.readOnly {
		close(s.quit)
		s.done.Wait()
		s.log.Close()
	}
	s.endShared(true)
	s.db.Close()
}

// Abandon is abandon for the external tests.
func Abandon(s *Store) { s.abandon() }

// Uncheckpointed returns the bytes of logged batches held in memory.
func Uncheckpointed(s *Store) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.memBytes
}

// Segments returns the number of log segments.
func Segments(s *Store) int { return s.log.Segments() }

// CheckpointNow runs a checkpoint; the store must have been opened with
// checkpoints that never trigger on their own, so that it runs alone.
func CheckpointNow(s *Store) error { return s.checkpoint() }

// ErrCheckpointBehind is errCheckpointBehind for the external tests.
var ErrCheckpointBehind = errCheckpointBehind

// PutCheckpointLSN records lsn as bbolt's checkpoint LSN, as a checkpoint
// transaction does; the store's goroutines must not be checkpointing.
func PutCheckpointLSN(s *Store, lsn wal.LSN) error {
	return s.update(func(tx *bolt.Tx) error { return putCheckpointLSN(tx, lsn) })
}

// SetMaxPersistedFreePages sets the freelist bound of every store until
// the returned function restores it.
func SetMaxPersistedFreePages(n int) (restore func()) {
	old := maxPersistedFreePages
	maxPersistedFreePages = n
	return func() { maxPersistedFreePages = old }
}

// SetViewed installs fn to run after every read transaction of s, without
// s.mu held, so that a test can close s between a load and its use. It is
// set before s is shared.
func SetViewed(s *Store, fn func()) { s.viewed = fn }

// CachedStreams is how many streams have a state in memory.
func CachedStreams(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams.CountLocked()
}

// PagesNow is bbolt's pages in use read in a transaction of its own, as
// InUse read them before it noted them at each commit.
func PagesNow(s *Store) (n int64, err error) {
	err = s.view(func(tx *bolt.Tx) error { n = boltfmt.PagesInUse(tx); return nil })
	return n, err
}

// CheckpointKicked reports whether a wake of the checkpointer is queued
// and not yet received: while the checkpointer runs a checkpoint, whether
// one more will follow it at once.
func CheckpointKicked(s *Store) bool { return len(s.ckKick) > 0 }
