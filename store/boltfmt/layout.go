package boltfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// LayoutVersion is the on-disk layout this package writes; it reads every
// version from 1 on (see doc.go, and seal.go for what version 2 adds).
const LayoutVersion = 2

var (
	bucketMeta    = []byte("meta")
	bucketStreams = []byte("streams")
	bucketValues  = []byte("values")
	keyVersion    = []byte("version")
)

// appendFillPercent is how full bbolt packs a page of a bucket whose keys
// are written in ascending order at a few points (the streams bucket:
// each stream appends after its last key; the bytes bucket: receipts by
// row index, checkpoints replaced in place). bbolt's default, 0.5, splits
// an overflowing page in the middle, and since appends never land in the
// left half again, every page such a bucket leaves behind is half empty:
// twice the file for the same data. At 1.0 a split leaves the left page
// full and the appends go on in the right one. Bucket.FillPercent is not
// stored in the file, so every transaction that writes these buckets sets
// it (streamsBucket, PutBytesTx). The values bucket is valuesBucket's.
const appendFillPercent = 1.0

// valuesFillPercent is the values bucket's: its keys are the token index,
// token/<conversation>/<scope>/<hex token>, and the token decides where
// an insert lands. A UUIDv7 token (what the client library draws) starts
// with its time, so each scope's inserts come in ascending order at the
// end of its range, as appends do; a random token (what other clients
// may send) lands anywhere, and a random insert into a page packed full
// splits it into a full page and a near-empty one again and again.
// Measured on 300,000 keys over 64 scopes, bytes of leaf pages per key
// (UUIDv7, random): 0.5: 143, 101; 0.8: 89, 135; 1.0: 75, 393. 0.8 takes
// most of the gain for UUIDv7 tokens at a bounded cost for random ones.
const valuesFillPercent = 0.8

// valuesBucket returns tx's values bucket, set to valuesFillPercent when
// tx writes.
func valuesBucket(tx *bolt.Tx) *bolt.Bucket {
	vb := tx.Bucket(bucketValues)
	if vb != nil && tx.Writable() {
		vb.FillPercent = valuesFillPercent
	}
	return vb
}

// streamsBucket returns tx's streams bucket, set to pack its pages full
// (appendFillPercent).
func streamsBucket(tx *bolt.Tx) *bolt.Bucket {
	sb := tx.Bucket(bucketStreams)
	if sb != nil && tx.Writable() {
		sb.FillPercent = appendFillPercent
	}
	return sb
}

// entryKey returns the key of entry seq of stream in the streams bucket:
// a 2-byte big-endian name length, the name, and the 8-byte big-endian seq.
// The length prefix keeps one stream's keys from being a prefix range of
// another's, and big-endian seqs sort in seq order.
func entryKey(stream string, seq uint64) []byte {
	k := make([]byte, 2+len(stream)+8)
	binary.BigEndian.PutUint16(k, uint16(len(stream)))
	copy(k[2:], stream)
	binary.BigEndian.PutUint64(k[2+len(stream):], seq)
	return k
}

// decodeEntryKey splits a key of the streams bucket into its stream name
// and seq; a key without entryKey's layout is an error.
func decodeEntryKey(k []byte) (stream string, seq uint64, err error) {
	if len(k) < 2+1+8 {
		return "", 0, fmt.Errorf("stream key %x: %d bytes, too short", k, len(k))
	}
	n := int(binary.BigEndian.Uint16(k))
	if n == 0 || n > store.MaxNameLen || len(k) != 2+n+8 {
		return "", 0, fmt.Errorf("stream key %x: name length %d in a %d-byte key", k, n, len(k))
	}
	return string(k[2 : 2+n]), binary.BigEndian.Uint64(k[2+n:]), nil
}

// streamLen returns the number of entries of stream in the streams bucket
// of tx, from its last key, checking the sums of the entries beside where
// the lookup lands (format.landed).
func streamLen(tx *bolt.Tx, c *bolt.Cursor, stream string) (uint64, error) {
	f, err := formatOf(tx)
	if err != nil {
		return 0, err
	}
	// The key just past every key of stream: its prefix and seq 2^64-1,
	// which no entry reaches.
	after := entryKey(stream, math.MaxUint64)
	k, v := c.Seek(after)
	if err := f.landed(tx, bucketStreams, k, v); err != nil {
		return 0, err
	}
	if k == nil {
		k, v = c.Last()
	} else {
		k, v = c.Prev()
	}
	if err := f.landed(tx, bucketStreams, k, v); err != nil {
		return 0, err
	}
	prefix := after[:len(after)-8]
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return 0, nil
	}
	if len(k) != len(after) {
		return 0, fmt.Errorf("stream %q: malformed key %x", stream, k)
	}
	return binary.BigEndian.Uint64(k[len(prefix):]) + 1, nil
}

func decodeValue(key string, raw []byte) (uint64, error) {
	if raw == nil {
		return 0, nil
	}
	if len(raw) != 8 {
		return 0, fmt.Errorf("value %q: malformed %x", key, raw)
	}
	return binary.BigEndian.Uint64(raw), nil
}

// bucketBytes holds the byte values of Compactor, key to value. It is
// created by the first PutBytes.
var bucketBytes = []byte("bytes")

// TrimRange deletes the entries of stream with seqs in [from, to) in tx.
func TrimRange(tx *bolt.Tx, stream string, from, to uint64) error {
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

// StreamFirst returns the seq of the first entry of stream in tx, 0 when
// it has none.
func StreamFirst(tx *bolt.Tx, stream string) (uint64, error) {
	f, err := formatOf(tx)
	if err != nil {
		return 0, err
	}
	start := entryKey(stream, 0)
	c := tx.Bucket(bucketStreams).Cursor()
	k, v := c.Seek(start)
	if err := f.landedAt(tx, bucketStreams, c, k, v); err != nil {
		return 0, err
	}
	if k == nil || !bytes.HasPrefix(k, start[:len(start)-8]) {
		return 0, nil
	}
	if len(k) != len(start) {
		return 0, fmt.Errorf("stream %q: malformed key %x", stream, k)
	}
	return binary.BigEndian.Uint64(k[len(start)-8:]), nil
}

// PutBytesTx sets the byte values of values in tx, creating the bytes
// bucket if needed; an empty value deletes its key.
func PutBytesTx(tx *bolt.Tx, values []store.Bytes) error {
	if err := writable(tx); err != nil {
		return err
	}
	bk, err := tx.CreateBucketIfNotExists(bucketBytes)
	if err != nil {
		return err
	}
	// Byte values are mostly written in key order (receipts by row index)
	// or replaced in place (checkpoints): pack pages full rather than
	// split them half full.
	bk.FillPercent = appendFillPercent
	for _, v := range values {
		if err := put(tx, bucketBytes, bk, v.Key, v.Value); err != nil {
			return err
		}
	}
	return nil
}

// put sets key in b, bucket of tx, to v sealed, or deletes it when v is
// empty. It first checks the sums of the entries where bbolt will put it
// (format.landedAt): a key flipped out of order there would have bbolt
// misplace this one, where no later lookup finds it. The file is of the
// current version (writable).
func put(tx *bolt.Tx, bucket []byte, b *bolt.Bucket, key string, v []byte) error {
	c := b.Cursor()
	k, raw := c.Seek([]byte(key))
	if err := (format{version: LayoutVersion}).landedAt(tx, bucket, c, k, raw); err != nil {
		return err
	}
	var err error
	if len(v) == 0 {
		err = b.Delete([]byte(key))
	} else {
		err = b.Put([]byte(key), seal(sumOf(bucket), []byte(key), v))
	}
	if err != nil {
		return fmt.Errorf("%s %q: %w", bucket, key, err)
	}
	return nil
}

// GetBytesTx returns a copy of byte value key in tx, nil when absent. A
// value whose checksum does not match is a *store.ChecksumError.
func GetBytesTx(tx *bolt.Tx, key string) ([]byte, error) {
	return lookupCopy(tx, bucketBytes, key)
}

// lookupCopy is lookup returning a copy, the caller's.
func lookupCopy(tx *bolt.Tx, bucket []byte, key string) ([]byte, error) {
	v, err := lookup(tx, bucket, key)
	if v == nil || err != nil {
		return nil, err
	}
	return append([]byte(nil), v...), nil
}

// lookup returns the bytes of key in bucket of tx, its checksum checked,
// nil when absent (bbolt's memory, valid during tx). An absent key is
// proven absent by its neighbors: a flipped bit in a key leaves its
// entry where the key was, so a lookup of the key lands beside it
// (format.landedAt), and a value is never read as absent because its key
// was damaged. A bucket not created yet (bytes) holds nothing.
func lookup(tx *bolt.Tx, bucket []byte, key string) ([]byte, error) {
	b := tx.Bucket(bucket)
	if b == nil {
		return nil, nil
	}
	f, err := formatOf(tx)
	if err != nil {
		return nil, err
	}
	c := b.Cursor()
	k, raw := c.Seek([]byte(key))
	if k == nil || string(k) != key {
		return nil, f.landedAt(tx, bucket, c, k, raw)
	}
	return f.value(tx, bucket, k, raw)
}

// CheckFile runs the checks a read-write Open runs on the file at path
// before bbolt maps it, without opening it, for another writer of the same
// file (the log-first store, which checkpoints into it): a damaged file is
// an error naming path and wrapping store.ErrCorrupt, a file another
// process is writing store.ErrLocked, and a missing or 0-byte one
// store.ErrNoData when mustExist is set (else nil: the caller creates it).
// Like Open, it reads every page of a file without a persisted freelist
// (bbolt would walk them all itself) and only the page structure above the
// leaves of one with (see doc.go, Opening a file).
func CheckFile(path string, mustExist bool) error {
	_, err := CheckFileWalk(path, mustExist, WalkAsNeeded)
	return err
}

// CheckFileWhole is CheckFile reading every page whatever the file, for
// a read-only open: offline tools, which should see damage before they
// report on the file.
func CheckFileWhole(path string, mustExist bool) error {
	_, err := CheckFileWalk(path, mustExist, WalkAll)
	return err
}

// Walk says how much of a file's page structure CheckFileWalk reads.
type Walk int

const (
	// WalkAsNeeded reads what bbolt's read-write open would trust: every
	// page of a file without a persisted freelist, the freelist and the
	// structure above the leaves of one with.
	WalkAsNeeded Walk = iota
	// WalkAll reads every page.
	WalkAll
	// WalkNone checks the size and meta pages only, for a caller that
	// walks the file once it holds its lock (CheckAtRest).
	WalkNone
)

// CheckFileWalk is CheckFile with the page walk chosen by walk. It also
// reports whether the file exists and is not empty (false: the caller
// creates it).
func CheckFileWalk(path string, mustExist bool, walk Walk) (exists bool, err error) {
	state, meta, err := checkFile(path)
	if err != nil {
		return false, fmt.Errorf("store: open: %w", err)
	}
	if state == fileValid {
		if walk == WalkNone {
			return true, nil
		}
		mode := walkModeFor(meta)
		if walk == WalkAll {
			mode = walkAll
		}
		if err := walkFile(path, meta, mode); err != nil {
			if lockedByWriter(path) {
				// A writer holds the file: what was read may be a commit
				// in progress, not damage.
				return false, fmt.Errorf("open %s: %w", path, store.ErrLocked)
			}
			return false, fmt.Errorf("store: open: %s: %w: %w", path, err, store.ErrCorrupt)
		}
		return true, nil
	}
	if mustExist {
		what := "does not exist"
		if state == fileEmpty {
			what = "is empty (0 bytes)"
		}
		return false, fmt.Errorf("store: open %s: the file %s: %w", path, what, store.ErrNoData)
	}
	return false, nil
}

// Contain runs fn, which calls into bbolt, and turns a panic or a memory
// fault during it into an error naming path and wrapping store.ErrCorrupt. bbolt
// reads pages through a mapping of the file and panics on a page it
// cannot parse (or faults on one the file does not hold): that is damaged
// input, not a broken invariant of this program, and the caller gets to
// say so instead of crashing. Only bbolt calls and the read callbacks of
// this package run inside it.
func Contain(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: bbolt failed reading it: %v: %w", path, r, store.ErrCorrupt)
		}
	}()
	return fn()
}

// InitLayout creates the buckets of a new file, in the current layout
// version, and checks the layout version of an existing one: one this
// build reads (an older one is then brought to the current version by
// Lay), else ErrNewerLayout or a damaged version (store.ErrCorrupt).
func InitLayout(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if tx.Bucket(bucketStreams) != nil || tx.Bucket(bucketValues) != nil {
			return errors.New("data file has buckets but no layout version")
		}
		var err error
		if meta, err = tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		if err := meta.Put(keyVersion, encodeVersion(LayoutVersion)); err != nil {
			return err
		}
	}
	if _, err := formatOf(tx); err != nil {
		return err
	}
	for _, name := range [][]byte{bucketStreams, bucketValues} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return nil
}

// CheckLayout checks, without writing, that the file has this package's
// layout, of a version this build reads (else ErrNewerLayout); a
// read-only open cannot create it.
func CheckLayout(tx *bolt.Tx) error {
	if _, err := formatOf(tx); err != nil {
		return err
	}
	for _, name := range [][]byte{bucketStreams, bucketValues} {
		if tx.Bucket(name) == nil {
			return fmt.Errorf("not a participantd store: no %s bucket", name)
		}
	}
	return nil
}

// The bbolt layout of doc.go, exported so that another writer of the same
// file (the log-first store, which checkpoints into it) and the offline
// tools read and write exactly what boltstore does.

// StreamLen returns the number of entries of stream in tx.
func StreamLen(tx *bolt.Tx, stream string) (uint64, error) {
	return streamLen(tx, tx.Bucket(bucketStreams).Cursor(), stream)
}

// ReadEntries appends to out the entries of stream in tx with seqs in
// [offset, stop), in seq order. Payloads are copies the caller owns.
func ReadEntries(tx *bolt.Tx, stream string, offset, stop uint64, out []store.Entry) ([]store.Entry, error) {
	out, _, _, err := ReadPageTx(tx, stream, offset, stop, 0, 0, out, nil)
	return out, err
}

// ReadPageTx appends to out the entries of stream in tx with seqs in
// [offset, stop), in seq order, stopping before the entry that would
// bring total, the payload bytes of the page so far, past maxBytes once
// out holds an entry (maxBytes <= 0: no bound). It returns out, the new
// total, and whether it stopped for maxBytes. Entries missing from the
// file (trimmed) are skipped: the caller checks out[0].Seq. Payloads are
// copies the caller owns, or, with buf not nil, copies in buf's memory
// (store.BufferedPageReader).
func ReadPageTx(tx *bolt.Tx, stream string, offset, stop uint64, maxBytes, total int, out []store.Entry, buf *store.PageBuffer) ([]store.Entry, int, bool, error) {
	stopped := false
	err := Entries(tx, stream, offset, func(seq uint64, v []byte) bool {
		if seq >= stop {
			return false
		}
		if maxBytes > 0 && len(out) > 0 && total+len(v) > maxBytes {
			stopped = true
			return false
		}
		total += len(v)
		out = append(out, store.Entry{Seq: seq, Payload: buf.Copy(v)})
		return true
	})
	return out, total, stopped, err
}

// Entries calls fn with each entry of stream in tx from seq offset on, in
// seq order, until fn returns false. Entries missing from the file
// (trimmed) are skipped: fn sees the seqs there are. v is bbolt's memory,
// valid only during the call. A malformed key of the stream is an error,
// and an entry whose checksum does not match a *store.ChecksumError
// (returned before fn sees it).
func Entries(tx *bolt.Tx, stream string, offset uint64, fn func(seq uint64, v []byte) bool) error {
	f, err := formatOf(tx)
	if err != nil {
		return err
	}
	first := entryKey(stream, offset)
	prefix := first[:len(first)-8]
	c := tx.Bucket(bucketStreams).Cursor()
	k, raw := c.Seek(first)
	if err := f.landedAt(tx, bucketStreams, c, k, raw); err != nil {
		return err
	}
	var next uint64
	for i := 0; k != nil && bytes.HasPrefix(k, prefix); k, raw = c.Next() {
		if len(k) != len(first) {
			return fmt.Errorf("stream %q: malformed key %x", stream, k)
		}
		v, err := f.value(tx, bucketStreams, k, raw)
		if err != nil {
			return err
		}
		seq := binary.BigEndian.Uint64(k[len(prefix):])
		if i > 0 && seq != next {
			// A trim removes a prefix only: an entry missing inside the
			// stream is damage (a key flipped out of place), never a gap
			// to read past.
			return &store.ChecksumError{File: tx.DB().Path(), Key: fmt.Sprintf("%s/%q", bucketStreams, stream),
				What: fmt.Sprintf("entry %d is missing, %d follows %d", next, seq, next-1)}
		}
		i, next = i+1, seq+1
		if !fn(seq, v) {
			return nil
		}
	}
	// Where the walk left the stream sits its last entry, should a flip
	// have moved that entry's key out of the stream.
	return f.landed(tx, bucketStreams, k, raw)
}

// TrimEntries deletes the entries of stream with seq < below in tx, as
// boltstore.Store.Trim does; entries already gone are skipped, so it is idempotent.
func TrimEntries(tx *bolt.Tx, stream string, below uint64) error {
	return TrimRange(tx, stream, 0, below)
}

// PutEntries writes payloads as the entries first, first+1, ... of stream.
// The stream must have exactly first entries in tx.
func PutEntries(tx *bolt.Tx, stream string, first uint64, payloads [][]byte) error {
	return putEntries(tx, stream, first, payloads, false)
}

// SumLen is the length of the checksum that seals a stored value.
const SumLen = sumLen

// PutOwnedEntries is PutEntries for payloads the caller hands over until
// the transaction ends: each has SumLen bytes of spare capacity past its
// length that nothing else reads or writes. The checksum is written
// there and bbolt given the payload itself, so that a checkpoint does
// not copy the bytes it writes (a copy that was a checkpoint's size of
// live heap at every checkpoint). A payload without the spare capacity
// is copied as PutEntries does.
func PutOwnedEntries(tx *bolt.Tx, stream string, first uint64, payloads [][]byte) error {
	return putEntries(tx, stream, first, payloads, true)
}

func putEntries(tx *bolt.Tx, stream string, first uint64, payloads [][]byte, owned bool) error {
	if err := writable(tx); err != nil {
		return err
	}
	sb := streamsBucket(tx)
	have, err := streamLen(tx, sb.Cursor(), stream)
	if err != nil {
		return err
	}
	if have != first {
		return fmt.Errorf("stream %q: file has %d entries, write starts at %d", stream, have, first)
	}
	// One buffer for every sealed payload that is copied: bbolt keeps each
	// value's slice until the commit, and a checkpoint writes many small
	// ones.
	n := 0
	for _, p := range payloads {
		if !owned || cap(p)-len(p) < sumLen {
			n += len(p) + sumLen
		}
	}
	buf := make([]byte, 0, n)
	for i, p := range payloads {
		seq := first + uint64(i)
		k := entryKey(stream, seq)
		sum := valueSum(sumStreams, k, p)
		var v []byte
		if owned && cap(p)-len(p) >= sumLen {
			v = binary.BigEndian.AppendUint32(p, sum)
		} else {
			at := len(buf)
			buf = append(buf, p...)
			buf = binary.BigEndian.AppendUint32(buf, sum)
			v = buf[at:]
		}
		if err := sb.Put(k, v[:len(v):len(v)]); err != nil {
			return fmt.Errorf("stream %q seq %d: %w", stream, seq, err)
		}
	}
	return nil
}

// ReadValueTx returns value key in tx, 0 when absent (proven absent, see
// lookup). A value whose checksum does not match is a
// *store.ChecksumError.
func ReadValueTx(tx *bolt.Tx, key string) (uint64, error) {
	raw, err := lookup(tx, bucketValues, key)
	if err != nil {
		return 0, err
	}
	return decodeValue(key, raw)
}

// PutValue sets value key in tx; 0 deletes it. It checks the entries
// where bbolt will put it first (put).
func PutValue(tx *bolt.Tx, key string, v uint64) error {
	if err := writable(tx); err != nil {
		return err
	}
	var raw []byte
	if v != 0 {
		raw = binary.BigEndian.AppendUint64(nil, v)
	}
	return put(tx, bucketValues, valuesBucket(tx), key, raw)
}

// ScanValues returns the values of tx whose key starts with prefix, in key
// order, leaving out the keys skip reports.
func ScanValues(tx *bolt.Tx, prefix string, skip func(key string) bool) ([]store.Value, error) {
	f, err := formatOf(tx)
	if err != nil {
		return nil, err
	}
	var out []store.Value
	c := tx.Bucket(bucketValues).Cursor()
	p := []byte(prefix)
	k, raw := c.Seek(p)
	if err := f.landedAt(tx, bucketValues, c, k, raw); err != nil {
		return nil, err
	}
	for ; ; k, raw = c.Next() {
		if k == nil || !bytes.HasPrefix(k, p) {
			if err := f.landed(tx, bucketValues, k, raw); err != nil {
				return nil, err
			}
			break
		}
		if skip(string(k)) {
			continue
		}
		if raw, err = f.value(tx, bucketValues, k, raw); err != nil {
			return nil, err
		}
		v, err := decodeValue(string(k), raw)
		if err != nil {
			return nil, err
		}
		out = append(out, store.Value{Key: string(k), Value: v})
	}
	return out, nil
}

// ReadMeta returns a copy of the meta key of tx, nil when absent (proven
// absent, see lookup). A value whose checksum does not match is a
// *store.ChecksumError.
func ReadMeta(tx *bolt.Tx, key string) ([]byte, error) {
	return lookupCopy(tx, bucketMeta, key)
}

// PutMeta sets the meta key of tx. The layout version and the upgrade's
// progress are not for callers to change.
func PutMeta(tx *bolt.Tx, key string, v []byte) error {
	if key == string(keyVersion) || key == string(keyUpgrade) || strings.TrimSpace(key) == "" {
		return fmt.Errorf("store: meta key %q is reserved", key)
	}
	if err := writable(tx); err != nil {
		return err
	}
	return tx.Bucket(bucketMeta).Put([]byte(key), seal(sumMeta, []byte(key), v))
}
