package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// The bbolt layout of doc.go, exported so that another writer of the same
// file (the log-first store, which checkpoints into it) and the offline
// tools read and write exactly what Bolt does.

// CheckWrite reports whether a stream or key name and a payload length are
// acceptable to every implementation: ErrInvalidName or ErrTooLarge, or
// nil.
func CheckWrite(name string, payloadLen int) error { return checkWrite(name, payloadLen) }

// InitLayout creates the buckets of a new file and checks the layout
// version of an existing one. It needs a writable tx.
func InitLayout(tx *bolt.Tx) error { return initLayout(tx) }

// CheckLayout checks, in a read-only tx, that the file has the layout this
// package reads.
func CheckLayout(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil || tx.Bucket(bucketStreams) == nil || tx.Bucket(bucketValues) == nil {
		return fmt.Errorf("store: data file has no layout")
	}
	if v := meta.Get(keyVersion); len(v) != 1 || v[0] != layoutVersion {
		return fmt.Errorf("store: unsupported layout version %v", v)
	}
	return nil
}

// StreamLen returns the number of entries of stream in tx.
func StreamLen(tx *bolt.Tx, stream string) (uint64, error) {
	return streamLen(tx.Bucket(bucketStreams).Cursor(), stream)
}

// ReadEntries appends to out the entries of stream in tx with seqs in
// [offset, stop), in seq order. Payloads are copies the caller owns.
func ReadEntries(tx *bolt.Tx, stream string, offset, stop uint64, out []Entry) ([]Entry, error) {
	out, _, _, err := ReadPageTx(tx, stream, offset, stop, 0, 0, out)
	return out, err
}

// ReadPageTx appends to out the entries of stream in tx with seqs in
// [offset, stop), in seq order, stopping before the entry that would
// bring total, the payload bytes of the page so far, past maxBytes once
// out holds an entry (maxBytes <= 0: no bound). It returns out, the new
// total, and whether it stopped for maxBytes. Entries missing from the
// file (trimmed) are skipped: the caller checks out[0].Seq. Payloads are
// copies the caller owns.
func ReadPageTx(tx *bolt.Tx, stream string, offset, stop uint64, maxBytes, total int, out []Entry) ([]Entry, int, bool, error) {
	first := entryKey(stream, offset)
	prefix := first[:len(first)-8]
	c := tx.Bucket(bucketStreams).Cursor()
	for k, v := c.Seek(first); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(k) != len(first) {
			return out, total, false, fmt.Errorf("stream %q: malformed key %x", stream, k)
		}
		seq := binary.BigEndian.Uint64(k[len(prefix):])
		if seq >= stop {
			break
		}
		if maxBytes > 0 && len(out) > 0 && total+len(v) > maxBytes {
			return out, total, true, nil
		}
		total += len(v)
		out = append(out, Entry{Seq: seq, Payload: append([]byte(nil), v...)})
	}
	return out, total, false, nil
}

// StreamFirst returns the seq of the first entry of stream in tx, 0 when
// the file holds none of it.
func StreamFirst(tx *bolt.Tx, stream string) (uint64, error) { return streamFirst(tx, stream) }

// TrimEntries deletes the entries of stream with seq < below in tx, as
// Bolt.Trim does; entries already gone are skipped, so it is idempotent.
func TrimEntries(tx *bolt.Tx, stream string, below uint64) error {
	return trimRange(tx, stream, 0, below)
}

// PutBytesTx sets byte values in tx as Bolt.PutBytes does: an empty
// value deletes its key.
func PutBytesTx(tx *bolt.Tx, values []Bytes) error { return putBytes(tx, values) }

// GetBytesTx returns a copy of byte value key in tx, nil when absent.
func GetBytesTx(tx *bolt.Tx, key string) []byte { return getBytes(tx, key) }

// Contain runs fn, which calls into bbolt on the file at path, and turns a
// panic or a memory fault during it into an error naming path and
// wrapping ErrCorrupt, as Bolt does for its own reads: a page bbolt cannot
// parse is damaged input, not a broken invariant. Only bbolt calls and
// read callbacks may run inside it.
func Contain(path string, fn func() error) error { return contain(path, fn) }

// CheckBytes reports whether byte values are acceptable to every
// implementation: ErrInvalidName or ErrTooLarge, or nil.
func CheckBytes(values []Bytes) error { return checkBytes(values) }

// PutEntries writes payloads as the entries first, first+1, ... of stream.
// The stream must have exactly first entries in tx.
func PutEntries(tx *bolt.Tx, stream string, first uint64, payloads [][]byte) error {
	sb := streamsBucket(tx)
	have, err := streamLen(sb.Cursor(), stream)
	if err != nil {
		return err
	}
	if have != first {
		return fmt.Errorf("stream %q: file has %d entries, write starts at %d", stream, have, first)
	}
	for i, p := range payloads {
		seq := first + uint64(i)
		if err := sb.Put(entryKey(stream, seq), p); err != nil {
			return fmt.Errorf("stream %q seq %d: %w", stream, seq, err)
		}
	}
	return nil
}

// ReadValueTx returns value key in tx, 0 when absent.
func ReadValueTx(tx *bolt.Tx, key string) (uint64, error) {
	return decodeValue(key, tx.Bucket(bucketValues).Get([]byte(key)))
}

// PutValue sets value key in tx; 0 deletes it.
func PutValue(tx *bolt.Tx, key string, v uint64) error {
	vb := valuesBucket(tx)
	var err error
	if v == 0 {
		err = vb.Delete([]byte(key))
	} else {
		raw := make([]byte, 8)
		binary.BigEndian.PutUint64(raw, v)
		err = vb.Put([]byte(key), raw)
	}
	if err != nil {
		return fmt.Errorf("value %q: %w", key, err)
	}
	return nil
}

// ScanValues returns the values of tx whose key starts with prefix, in key
// order, leaving out the keys skip reports.
func ScanValues(tx *bolt.Tx, prefix string, skip func(key string) bool) ([]Value, error) {
	var out []Value
	c := tx.Bucket(bucketValues).Cursor()
	p := []byte(prefix)
	for k, raw := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, raw = c.Next() {
		if skip(string(k)) {
			continue
		}
		v, err := decodeValue(string(k), raw)
		if err != nil {
			return nil, err
		}
		out = append(out, Value{Key: string(k), Value: v})
	}
	return out, nil
}

// ReadMeta returns a copy of the meta key of tx, nil when absent.
func ReadMeta(tx *bolt.Tx, key string) []byte {
	if v := tx.Bucket(bucketMeta).Get([]byte(key)); v != nil {
		return append([]byte(nil), v...)
	}
	return nil
}

// PutMeta sets the meta key of tx. The layout version is not for callers
// to change.
func PutMeta(tx *bolt.Tx, key string, v []byte) error {
	if key == string(keyVersion) || strings.TrimSpace(key) == "" {
		return fmt.Errorf("store: meta key %q is reserved", key)
	}
	return tx.Bucket(bucketMeta).Put([]byte(key), v)
}
