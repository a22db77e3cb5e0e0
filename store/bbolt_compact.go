package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

var (
	_ PageReader = (*Bolt)(nil)
	_ Compactor  = (*Bolt)(nil)
)

// bucketBytes holds the byte values of Compactor, key to value. It is
// created by the first PutBytes, so a file that never had one keeps the
// layout of version 1 exactly.
var bucketBytes = []byte("bytes")

// trimChunk bounds the keys one trim transaction deletes, so that a trim of
// a long prefix does not build one huge transaction.
const trimChunk = 16384

// ReadPage implements PageReader. As ReadFrom, committed entries are read
// with one cursor in one read transaction and staged ones copied from
// memory; the walk stops at the first entry past maxBytes, so a page never
// copies more than maxBytes plus its first entry.
func (b *Bolt) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]Entry, error) {
	return b.read(stream, offset, limit, maxBytes)
}

// readOrCompactedErr passes a *CompactedError through and translates any
// other error of a read transaction.
func (b *Bolt) readOrCompactedErr(err error) error {
	var ce *CompactedError
	if errors.As(err, &ce) {
		return ce
	}
	return b.readErr(err)
}

// update runs fn in its own bbolt write transaction, outside group commit:
// when it returns nil, what fn wrote is durable. A failed transaction sets
// the sticky error, as a failed commit does.
func (b *Bolt) update(what string, fn func(tx *bolt.Tx) error) error {
	if err := b.usable(); err != nil {
		return err
	}
	if err := b.db.Update(fn); err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.err == nil {
			b.err = fmt.Errorf("%w: %s in %s: %w", ErrFailed, what, b.path, err)
		}
		return b.err
	}
	return nil
}

// Trim implements Compactor. It deletes the trimmed entries in write
// transactions of its own, so it is durable when it returns nil. The
// committed length bounds it, and the last committed entry stays, so a
// concurrent commit still finds its stream's length from its last key.
func (b *Bolt) Trim(stream string, below uint64) error {
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
		return fmt.Errorf("trim %q below %d with %d flushed entries: %w", stream, below, committed, ErrTrimRange)
	}
	for from := first; from < below; from += trimChunk {
		to := min(below, from+trimChunk)
		err := b.update("trim", func(tx *bolt.Tx) error { return trimRange(tx, stream, from, to) })
		if err != nil {
			return err
		}
	}
	return nil
}

// First implements Compactor: the seq of the stream's first key in the
// file, or 0 when it has none (nothing of it was ever trimmed then, since a
// trim keeps the last committed entry).
func (b *Bolt) First(stream string) (uint64, error) {
	err := b.usable()
	if err != nil {
		return 0, err
	}
	var first uint64
	err = b.view(func(tx *bolt.Tx) error {
		var err error
		first, err = streamFirst(tx, stream)
		return err
	})
	if err != nil {
		return 0, b.readErr(err)
	}
	return first, nil
}

// PutBytes implements Compactor in one write transaction of its own: the
// values are durable when it returns nil.
func (b *Bolt) PutBytes(values []Bytes) error {
	if err := checkBytes(values); err != nil {
		return err
	}
	return b.update("put bytes", func(tx *bolt.Tx) error { return putBytes(tx, values) })
}

// GetBytes implements Compactor.
func (b *Bolt) GetBytes(key string) ([]byte, error) {
	err := b.usable()
	if err != nil {
		return nil, err
	}
	var out []byte
	err = b.view(func(tx *bolt.Tx) error {
		out = getBytes(tx, key)
		return nil
	})
	if err != nil {
		return nil, b.readErr(err)
	}
	return out, nil
}

// trimRange deletes the entries of stream with seqs in [from, to) in tx.
func trimRange(tx *bolt.Tx, stream string, from, to uint64) error {
	// Keys are collected, then deleted: a cursor that deletes as it walks
	// may skip the key after each deletion.
	sb := streamsBucket(tx)
	c := sb.Cursor()
	last := entryKey(stream, to)
	var keys [][]byte
	for k, _ := c.Seek(entryKey(stream, from)); k != nil && bytes.Compare(k, last) < 0; k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := sb.Delete(k); err != nil {
			return fmt.Errorf("stream %q: trim: %w", stream, err)
		}
	}
	return nil
}

// streamFirst returns the seq of the first entry of stream in tx, 0 when
// it has none.
func streamFirst(tx *bolt.Tx, stream string) (uint64, error) {
	start := entryKey(stream, 0)
	k, _ := tx.Bucket(bucketStreams).Cursor().Seek(start)
	if k == nil || !bytes.HasPrefix(k, start[:len(start)-8]) {
		return 0, nil
	}
	if len(k) != len(start) {
		return 0, fmt.Errorf("stream %q: malformed key %x", stream, k)
	}
	return binary.BigEndian.Uint64(k[len(start)-8:]), nil
}

// putBytes sets the byte values of values in tx, creating the bytes
// bucket if needed; an empty value deletes its key.
func putBytes(tx *bolt.Tx, values []Bytes) error {
	bk, err := tx.CreateBucketIfNotExists(bucketBytes)
	if err != nil {
		return err
	}
	// Byte values are mostly written in key order (receipts by row index)
	// or replaced in place (checkpoints): pack pages full rather than
	// split them half full.
	bk.FillPercent = appendFillPercent
	for _, v := range values {
		if len(v.Value) == 0 {
			err = bk.Delete([]byte(v.Key))
		} else {
			err = bk.Put([]byte(v.Key), append([]byte(nil), v.Value...))
		}
		if err != nil {
			return fmt.Errorf("bytes %q: %w", v.Key, err)
		}
	}
	return nil
}

// getBytes returns a copy of byte value key in tx, nil when absent.
func getBytes(tx *bolt.Tx, key string) []byte {
	if bk := tx.Bucket(bucketBytes); bk != nil {
		if v := bk.Get([]byte(key)); v != nil {
			return append([]byte(nil), v...)
		}
	}
	return nil
}
