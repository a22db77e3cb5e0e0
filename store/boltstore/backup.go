package boltstore

import (
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// Backup writes a consistent copy of the data file to w while the store
// serves: one bbolt read transaction (Tx.WriteTo), so the copy holds every
// commit that completed before it began and nothing of one that completed
// later; writes staged but not flushed are not in it, and no answered
// operation is, since answers wait for their flushes. begin, if not nil,
// is told the copy's size first. It returns the bytes written; an error of
// w is returned as is, the store stays usable.
func (b *Store) Backup(w io.Writer, begin store.BackupSize) (int64, error) {
	err := b.usable()
	if err != nil {
		return 0, err
	}
	var n int64
	err = b.db.View(func(tx *bolt.Tx) error {
		if begin != nil {
			begin(tx.Size())
		}
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("store: backup of %s: %w", b.path, err)
	}
	return n, nil
}
