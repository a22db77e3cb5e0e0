package logfirst

import (
	"sync"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store/boltfmt"
)

// readTx is the read transaction that point reads of values (loadValue)
// share between two writes to bbolt, instead of each beginning and ending
// its own: a token lookup that misses every layer in memory, as every
// fresh token does, then costs a seek, not a transaction (bbolt allocates
// and initializes one per Begin).
//
// It is never older than bbolt's last commit: a write transaction
// (Store.update) ends it first and none is kept while one is in progress
// (a read then takes a transaction of its own, as view does), so a value
// a checkpoint landed is read from the file once the checkpoint forgets it
// from memory. Ending it first is also what a commit needs: bbolt's remap
// waits for every open read transaction, and one held across the commit
// would keep the pages the commit frees from being reused. Close ends it
// for good before it closes bbolt, which would wait for it too.
type readTx struct {
	// mu guards the fields below and every use of tx (a bbolt transaction
	// is not safe for concurrent use). It is never held across a write
	// transaction, and is taken last (after ckMu or filesMu, never
	// with mu): no other lock of the store is taken while it is held.
	mu sync.Mutex
	// tx is the shared transaction, nil when none is open.
	tx *bolt.Tx
	// writing counts the write transactions in progress.
	writing int
	// closed is set by Close: no transaction is kept from then on.
	closed bool
}

// readShared runs fn, a point read, on the shared read transaction,
// beginning one if none is open and no write is in progress; otherwise
// it runs fn in a transaction of its own (view). Errors are fn's,
// bbolt's, or a mapped page that faulted (store.ErrCorrupt, as view).
func (s *Store) readShared(fn func(*bolt.Tx) error) error {
	if s.fresh {
		return nil // as view: a fresh store holds nothing
	}
	r := &s.rtx
	r.mu.Lock()
	if r.tx == nil && (r.writing > 0 || r.closed) {
		r.mu.Unlock()
		return s.view(fn)
	}
	err := s.readSharedLocked(fn)
	r.mu.Unlock()
	if s.viewed != nil {
		s.viewed()
	}
	return err
}

// readSharedLocked runs fn on the shared transaction, beginning it if
// none is open. s.rtx.mu must be held.
func (s *Store) readSharedLocked(fn func(*bolt.Tx) error) error {
	r := &s.rtx
	if r.tx == nil {
		tx, err := s.db.Begin(false)
		if err != nil {
			return err
		}
		r.tx = tx
	}
	return boltfmt.Contain(s.db.Path(), func() error { return fn(r.tx) })
}

// endShared ends the shared read transaction before a write transaction
// (closing false) or for good before bbolt is closed (closing true); a
// write then calls writeDone when its commit returned.
func (s *Store) endShared(closing bool) {
	r := &s.rtx
	r.mu.Lock()
	defer r.mu.Unlock()
	if closing {
		r.closed = true
	} else {
		r.writing++
	}
	if r.tx != nil {
		// A read transaction's rollback only releases it: no error a
		// caller could act on.
		_ = r.tx.Rollback()
		r.tx = nil
	}
}

// writeDone ends what endShared(false) began: the next point read may
// keep a transaction again, which then sees the write's commit.
func (s *Store) writeDone() {
	r := &s.rtx
	r.mu.Lock()
	r.writing--
	r.mu.Unlock()
}
