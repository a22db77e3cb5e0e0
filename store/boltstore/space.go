package boltstore

import (
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store/boltfmt"
)

// Space walks every bucket of the file in one read transaction.
func (b *Store) Space() (*boltfmt.Space, error) {
	if err := b.usable(); err != nil {
		return nil, err
	}
	sp := &boltfmt.Space{}
	fi, err := os.Stat(b.path)
	if err != nil {
		return nil, err
	}
	sp.FileBytes = fi.Size()
	err = b.view(func(tx *bolt.Tx) error { return boltfmt.ReadSpace(tx, sp) })
	if err != nil {
		return nil, b.readErr(err)
	}
	return sp, nil
}

// InUse returns the bytes of the file's pages that hold data: its pages up
// to the last in use, less those on bbolt's freelist (free, or pending
// until no reader needs them). Unlike the file's size, which never
// shrinks, it falls when a compaction frees pages, and writes reuse them
// before the file grows. It is what --max-data-bytes is checked against.
// It reads one meta page (a read transaction) and never fails on a
// healthy store.
func (b *Store) InUse() (int64, error) {
	if err := b.usable(); err != nil {
		return 0, err
	}
	var n int64
	if err := b.view(func(tx *bolt.Tx) error { n = boltfmt.PagesInUse(tx); return nil }); err != nil {
		return 0, b.readErr(err)
	}
	return n, nil
}
