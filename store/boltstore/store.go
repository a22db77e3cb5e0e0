package boltstore

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/internal/stage"
)

// DefaultLockTimeout is how long Open waits for the data file's lock when
// Options.LockTimeout is zero.
const DefaultLockTimeout = time.Second

// Options configures Open. The zero value means the defaults.
type Options struct {
	// LockTimeout bounds how long Open waits for the data file's lock while
	// another process (or another Open in this one) holds it. Zero or
	// negative means DefaultLockTimeout.
	LockTimeout time.Duration
	// ReadOnly opens an existing file for reading only: the file is never
	// written, created or initialized, a shared lock lets other read-only
	// opens proceed while a writer is refused, and Append, CAS and a Flush
	// with writes would return store.ErrReadOnly. A missing or 0-byte file fails
	// with store.ErrNoData.
	ReadOnly bool
	// MustExist refuses to create the file: a missing or 0-byte file fails
	// with store.ErrNoData instead of becoming a new, empty store. The caller sets
	// it when something says the store existed before (see
	// cmd/participantd), so that a lost file is not silently replaced.
	MustExist bool
	// PersistFreelist writes bbolt's freelist at every commit, so that a
	// later read-write open reads it instead of walking every page of the
	// file (linear in its size: seconds at gigabytes). The log-first store
	// always writes its file this way, off its hot path; false (the
	// default) keeps bbolt's NoFreelistSync, which saves a page write per
	// commit of Store's own group commits. Either kind of file opens either
	// way: bbolt reads a persisted freelist when it finds one and rebuilds
	// it otherwise.
	PersistFreelist bool
}

// Store is the embedded store.DurableStore: one bbolt file. Appends and CAS writes
// are staged in memory and visible at once; Flush makes them durable with
// group commit, so that concurrent flushes share one bbolt transaction.
//
// A Store owns one committer goroutine, started by Open and stopped by Close.
type Store struct {
	path     string
	db       *bolt.DB
	hooks    hooks
	readOnly bool

	// quit is closed by Close to stop the committer; done is closed by the
	// committer when it has stopped.
	quit chan struct{}
	done chan struct{}

	flushes    atomic.Uint64
	commits    atomic.Uint64
	appends    atomic.Uint64
	casWrites  atomic.Uint64
	valueLoads atomic.Uint64

	// mu guards every field below. It is never held across a bbolt call or a
	// channel operation.
	mu sync.Mutex
	// err is the sticky error of a failed commit; it wraps store.ErrFailed.
	err    error
	closed bool
	// streams holds, for each stream used since Open, its committed
	// length and staged payloads, and the streams with payloads staged
	// since the last commit began.
	streams *stage.Streams[*boltStream]
	// vals holds the values written and not yet committed (staged, or in
	// the commit in progress), which reads see before the file, and the
	// values read from the file since the last commit; a commit forgets
	// every read (stage.ForgetAtLanding).
	vals *stage.Values
	// group is the group commit: the batch being committed and the next
	// one (its fields are guarded by mu).
	group *stage.Group
}

// boltStream is the in-memory state of one stream. Its fields are guarded by
// Store.mu.
type boltStream struct {
	// committed is the number of entries in the bbolt file.
	committed uint64
	// pending holds the payloads of entries committed..committed+len-1, not
	// yet durable. Elements are never modified once appended, so readers may
	// keep a sub-slice after releasing mu.
	pending [][]byte
}

// LenLocked implements stage.Stream.
func (s *boltStream) LenLocked() uint64 { return s.committed + uint64(len(s.pending)) }

// StageLocked implements stage.Stream.
func (s *boltStream) StageLocked(payload []byte) { s.pending = append(s.pending, payload) }

// hooks let tests hold or fail a commit deterministically.
type hooks struct {
	// beforeCommit is called by the committer before each commit
	// transaction, without mu held.
	beforeCommit func()
	// commitErr, when it returns an error, makes the commit transaction
	// fail with it (and roll back).
	commitErr func() error
	// flushWaiting is called by Flush just before it waits for a batch.
	flushWaiting func()
	// casLoaded is called by CAS after it read key's value from the file,
	// before it takes mu again.
	casLoaded func(key string)
	// syncDir, when set, replaces the fsync of the directory of a file
	// Open created.
	syncDir func(dir string) error
}

var _ store.DurableStore = (*Store)(nil)

// Path returns the data file's path.
func (b *Store) Path() string { return b.path }

// store.Stats returns the store's counters. It never fails, even after Close.
func (b *Store) Stats() store.Stats {
	return store.Stats{
		Flushes:    b.flushes.Load(),
		Commits:    b.commits.Load(),
		Appends:    b.appends.Load(),
		CASWrites:  b.casWrites.Load(),
		ValueLoads: b.valueLoads.Load(),
	}
}

// usableLocked returns the sticky error, or store.ErrClosed after Close. b.mu must
// be held.
func (b *Store) usableLocked() error {
	if b.err != nil {
		return b.err
	}
	if b.closed {
		return store.ErrClosed
	}
	return nil
}

// usable is usableLocked for a caller that does not hold b.mu.
func (b *Store) usable() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.usableLocked()
}

// readErr translates an error of a read transaction.
func (b *Store) readErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return store.ErrClosed
	}
	if errors.Is(err, store.ErrCorrupt) {
		return fmt.Errorf("store: read: %w", err)
	}
	return fmt.Errorf("store: read %s: %w", b.path, err)
}

// checkWrite refuses a write that no Store accepts, and every write to a
// read-only one.
func (b *Store) checkWrite(name string, payloadLen int) error {
	if b.readOnly {
		return fmt.Errorf("store: write to %s: %w", b.path, store.ErrReadOnly)
	}
	return store.CheckWrite(name, payloadLen)
}

// lockStream locks b.mu and returns the state of stream, first loading its
// committed length from bbolt if the stream was not used since Open (see
// stage.Streams.Get). On error b.mu is not held.
func (b *Store) lockStream(stream string) (*boltStream, error) {
	b.mu.Lock()
	st, err := b.streams.Get(&b.mu, stream, b.usableLocked, b.loadStream)
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	return st, nil
}

// loadStream returns the state of a stream not used since Open.
func (b *Store) loadStream(stream string) (*boltStream, error) {
	n, err := b.loadLen(stream)
	if err != nil {
		return nil, err
	}
	return &boltStream{committed: n}, nil
}

// loadLen returns the committed length of stream.
func (b *Store) loadLen(stream string) (uint64, error) {
	var n uint64
	err := b.view(func(tx *bolt.Tx) error {
		var err error
		n, err = boltfmt.StreamLen(tx, stream)
		return err
	})
	if err != nil {
		return 0, b.readErr(err)
	}
	return n, nil
}

// Append implements store.DurableStore. Besides the errors of store.DurableStore it
// returns the sticky error (wrapping store.ErrFailed) after a failed commit.
func (b *Store) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	if err := b.checkWrite(stream, len(payload)); err != nil {
		return 0, err
	}
	p := append([]byte(nil), payload...)
	st, err := b.lockStream(stream)
	if err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	seq, err := b.streams.AppendLocked(stream, st, p, expectedSeq)
	if err != nil {
		return 0, err
	}
	b.appends.Add(1)
	return seq, nil
}

// Len implements store.DurableStore. It reads the file only the first time a
// stream is used after Open, and every time for a stream that does not
// exist, which it keeps no state for (stage.Streams.Peek).
func (b *Store) Len(stream string) (uint64, error) {
	b.mu.Lock()
	st, err := b.streams.Peek(&b.mu, stream, b.usableLocked, b.loadStream)
	if err != nil {
		b.mu.Unlock()
		return 0, err
	}
	defer b.mu.Unlock()
	return st.LenLocked(), nil
}

// ReadFrom implements store.DurableStore. Committed entries are read in one bbolt
// read transaction with a cursor; staged ones are copied from memory.
func (b *Store) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	return b.read(stream, offset, limit, 0)
}

// read is ReadFrom when maxBytes <= 0 and store.ReadPage otherwise: the walk
// stops before the first entry that would bring the page past maxBytes
// once it holds one, so a page never copies more than maxBytes plus its
// first entry.
func (b *Store) read(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	end := uint64(math.MaxUint64)
	if limit > 0 && uint64(limit) <= math.MaxUint64-offset {
		end = offset + uint64(limit)
	}
	// committed bounds what is read from bbolt. For a stream unused since
	// Open it is unknown, and bbolt holds the whole stream.
	committed := uint64(math.MaxUint64)
	var tail [][]byte // staged payloads from seq tailStart on
	var tailStart uint64

	b.mu.Lock()
	if err := b.usableLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if st, ok := b.streams.LookupLocked(stream); ok {
		// Taking the committed length before the read transaction begins is
		// what makes the merge safe: a commit advances st.committed only
		// after its transaction is visible to every later reader.
		committed = st.committed
		end = min(end, st.LenLocked())
		if offset >= end {
			b.mu.Unlock()
			return nil, nil
		}
		if end > committed {
			tailStart = max(offset, committed)
			tail = st.pending[tailStart-committed : end-committed : end-committed]
		}
	}
	b.mu.Unlock()

	var out []store.Entry
	if maxBytes <= 0 && end != math.MaxUint64 {
		out = make([]store.Entry, 0, end-offset)
	}
	total := 0
	// full reports that the next entry, of n bytes, does not fit; once it
	// is true the page ends there, so it never skips an entry.
	stopped := false
	full := func(n int) bool {
		stopped = stopped || maxBytes > 0 && len(out) > 0 && total+n > maxBytes
		return stopped
	}
	if stop := min(end, committed); offset < stop {
		err := b.view(func(tx *bolt.Tx) error {
			var compacted error
			err := boltfmt.Entries(tx, stream, offset, func(seq uint64, v []byte) bool {
				if len(out) == 0 && seq > offset {
					// Only a Trim (compact.go) leaves a gap.
					compacted = &store.CompactedError{Stream: stream, Offset: offset, First: seq}
					return false
				}
				if seq >= stop || full(len(v)) {
					return false
				}
				total += len(v)
				out = append(out, store.Entry{Seq: seq, Payload: append([]byte(nil), v...)})
				return true
			})
			if err != nil {
				return err
			}
			return compacted
		})
		if err != nil {
			return nil, b.readOrCompactedErr(err)
		}
	}
	if stopped {
		return out, nil
	}
	for i, p := range tail {
		if full(len(p)) {
			break
		}
		total += len(p)
		out = append(out, store.Entry{Seq: tailStart + uint64(i), Payload: append([]byte(nil), p...)})
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// CAS implements store.DurableStore. Besides the errors of store.DurableStore it returns
// the sticky error (wrapping store.ErrFailed) after a failed commit.
func (b *Store) CAS(key string, old, new uint64) error {
	if err := b.checkWrite(key, 0); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	actual, err := b.vals.Current(&b.mu, key, b.usableLocked, b.loadForCAS)
	if err != nil {
		return err
	}
	if actual != old {
		return &store.CASConflictError{Key: key, Expected: old, Actual: actual}
	}
	b.vals.StageLocked(key, new)
	b.casWrites.Add(1)
	return nil
}

// loadForCAS is loadValue for CAS, which runs the casLoaded hook after a
// load.
func (b *Store) loadForCAS(key string) (uint64, error) {
	v, err := b.loadValue(key)
	if err == nil && b.hooks.casLoaded != nil {
		b.hooks.casLoaded(key)
	}
	return v, err
}

// ReadValue implements store.DurableStore. A value read from the file is
// cached until the next commit, so that a CAS of the key that follows (a
// token lookup then its index write) need not read the file again.
func (b *Store) ReadValue(key string) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.vals.Read(&b.mu, key, b.usableLocked, b.loadValue)
}

func (b *Store) loadValue(key string) (uint64, error) {
	b.valueLoads.Add(1)
	var v uint64
	err := b.view(func(tx *bolt.Tx) error {
		var err error
		v, err = boltfmt.ReadValueTx(tx, key)
		return err
	})
	if err != nil {
		return 0, b.readErr(err)
	}
	return v, nil
}

// Scan implements store.DurableStore. Values written since the last commit
// overlay the committed ones read in one bbolt read transaction.
func (b *Store) Scan(prefix string) ([]store.Value, error) {
	b.mu.Lock()
	if err := b.usableLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	overlay := b.vals.OverlayLocked(prefix)
	b.mu.Unlock()

	var out []store.Value
	err := b.view(func(tx *bolt.Tx) error {
		var err error
		out, err = boltfmt.ScanValues(tx, prefix, func(key string) bool {
			_, ok := overlay[key]
			return ok
		})
		return err
	})
	if err != nil {
		return nil, b.readErr(err)
	}
	return stage.MergeScan(out, overlay), nil
}

// Close implements store.DurableStore: it stops the committer, waiting for a
// commit in progress, fails the flushes waiting for a later one with
// store.ErrClosed, discards staged writes and closes the file. After a failed
// commit it still releases the file and returns the sticky error.
func (b *Store) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return store.ErrClosed
	}
	b.closed = true
	sticky := b.err
	b.mu.Unlock()

	close(b.quit)
	<-b.done
	err := b.db.Close()

	b.mu.Lock()
	b.streams.ReleaseLocked()
	b.vals.ReleaseLocked()
	b.mu.Unlock()
	if sticky != nil {
		return sticky
	}
	if err != nil {
		return fmt.Errorf("store: close %s: %w", b.path, err)
	}
	return nil
}
