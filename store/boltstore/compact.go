package boltstore

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
)

var (
	_ store.PageReader = (*Store)(nil)
	_ store.Compactor  = (*Store)(nil)
)

// trimChunk bounds the keys one trim transaction deletes, so that a trim of
// a long prefix does not build one huge transaction.
const trimChunk = 16384

// store.ReadPage implements store.PageReader. As ReadFrom, committed entries are read
// with one cursor in one read transaction and staged ones copied from
// memory; the walk stops at the first entry past maxBytes, so a page never
// copies more than maxBytes plus its first entry.
func (b *Store) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	return b.read(stream, offset, limit, maxBytes)
}

// readOrCompactedErr passes a *store.CompactedError through and translates any
// other error of a read transaction.
func (b *Store) readOrCompactedErr(err error) error {
	var ce *store.CompactedError
	if errors.As(err, &ce) {
		return ce
	}
	return b.readErr(err)
}

// update runs fn in its own bbolt write transaction, outside group commit:
// when it returns nil, what fn wrote is durable. A failed transaction sets
// the sticky error, as a failed commit does.
func (b *Store) update(what string, fn func(tx *bolt.Tx) error) error {
	if err := b.usable(); err != nil {
		return err
	}
	if err := b.db.Update(fn); err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.err == nil {
			b.err = fmt.Errorf("%w: %s in %s: %w", store.ErrFailed, what, b.path, err)
		}
		return b.err
	}
	return nil
}

// Trim implements store.Compactor. It deletes the trimmed entries in write
// transactions of its own, so it is durable when it returns nil. The
// committed length bounds it, and the last committed entry stays, so a
// concurrent commit still finds its stream's length from its last key.
func (b *Store) Trim(stream string, below uint64) error {
	st, err := b.lockStream(stream)
	if err != nil {
		return err
	}
	committed := st.committed
	b.mu.Unlock()
	first, err := b.First(stream)
	if err != nil {
		return err
	}
	if below <= first {
		return nil
	}
	if below >= committed {
		return fmt.Errorf("trim %q below %d with %d flushed entries: %w", stream, below, committed, store.ErrTrimRange)
	}
	for from := first; from < below; from += trimChunk {
		to := min(below, from+trimChunk)
		err := b.update("trim", func(tx *bolt.Tx) error { return boltfmt.TrimRange(tx, stream, from, to) })
		if err != nil {
			return err
		}
	}
	return nil
}

// First implements store.Compactor: the seq of the stream's first key in the
// file, or 0 when it has none (nothing of it was ever trimmed then, since a
// trim keeps the last committed entry).
func (b *Store) First(stream string) (uint64, error) {
	err := b.usable()
	if err != nil {
		return 0, err
	}
	var first uint64
	err = b.view(func(tx *bolt.Tx) error {
		var err error
		first, err = boltfmt.StreamFirst(tx, stream)
		return err
	})
	if err != nil {
		return 0, b.readErr(err)
	}
	return first, nil
}

// PutBytes implements store.Compactor in one write transaction of its own: the
// values are durable when it returns nil.
func (b *Store) PutBytes(values []store.Bytes) error {
	if err := store.CheckBytes(values); err != nil {
		return err
	}
	return b.update("put bytes", func(tx *bolt.Tx) error { return boltfmt.PutBytesTx(tx, values) })
}

// GetBytes implements store.Compactor.
func (b *Store) GetBytes(key string) ([]byte, error) {
	err := b.usable()
	if err != nil {
		return nil, err
	}
	var out []byte
	err = b.view(func(tx *bolt.Tx) error {
		var err error
		out, err = boltfmt.GetBytesTx(tx, key)
		return err
	})
	if err != nil {
		return nil, b.readErr(err)
	}
	return out, nil
}
