package boltstore

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
)

// Check reads every committed key and value of the file through bbolt, so
// that every page reachable from the meta page is read once, and checks
// that each key and value has this package's layout. It returns nil when
// all is readable, or the first damage found, naming the file and wrapping
// store.ErrCorrupt; a panic or memory fault of bbolt while it reads is reported
// the same way. Staged writes are not checked. It is meant for offline
// verification: it reads the whole file in one read transaction.
func (b *Store) Check() error {
	b.mu.Lock()
	err := b.usableLocked()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if b.readOnly {
		// No writer can hold the file: its pages are at rest.
		if err := boltfmt.CheckAtRest(b.path); err != nil {
			return err
		}
	}
	err = b.view(func(tx *bolt.Tx) error {
		return boltfmt.CheckKeys(tx)
	})
	if err == nil {
		return nil
	}
	if errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrClosed) {
		return err
	}
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return store.ErrClosed
	}
	return fmt.Errorf("%s: %w: %w", b.path, err, store.ErrCorrupt)
}
