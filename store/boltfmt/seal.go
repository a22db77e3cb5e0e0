package boltfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"
	"weak"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// Every value of layout version 2 is sealed: its bytes, then a CRC-32C
// (Castagnoli, as etcd's log records and pebble's blocks) of the bucket's
// name, the key and those bytes, 4 bytes big-endian. The name and key are
// in the sum so that a value moved to another key, or another bucket,
// does not verify there. bbolt checksums only its meta pages: without the
// seal a flipped bit in a payload is served as if it had been written.
const sumLen = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// bucketSum returns the CRC-32C of a bucket's name and a zero byte, where
// every sum of that bucket starts.
func bucketSum(name []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, name), castagnoli, []byte{0})
}

var (
	sumMeta    = bucketSum(bucketMeta)
	sumStreams = bucketSum(bucketStreams)
	sumValues  = bucketSum(bucketValues)
	sumBytes   = bucketSum(bucketBytes)
)

// sumOf returns the bucketSum of bucket, one of the layout's.
func sumOf(bucket []byte) uint32 {
	switch string(bucket) {
	case "streams":
		return sumStreams
	case "values":
		return sumValues
	case "bytes":
		return sumBytes
	case "meta":
		return sumMeta
	}
	return bucketSum(bucket)
}

// valueSum is the checksum a sealed value v of key in the bucket whose
// bucketSum is seed carries.
func valueSum(seed uint32, key, v []byte) uint32 {
	return crc32.Update(crc32.Update(seed, castagnoli, key), castagnoli, v)
}

// seal returns v followed by its checksum, in a new slice.
func seal(seed uint32, key, v []byte) []byte {
	out := make([]byte, len(v)+sumLen)
	copy(out, v)
	binary.BigEndian.PutUint32(out[len(v):], valueSum(seed, key, v))
	return out
}

// unseal returns the bytes of sealed value raw of key in bucket (a
// subslice of raw), or a *store.ChecksumError naming the file of tx,
// bucket and key when its checksum does not match them.
func unseal(tx *bolt.Tx, bucket []byte, key, raw []byte) ([]byte, error) {
	if len(raw) < sumLen {
		return nil, corruptValue(tx, bucket, key, fmt.Sprintf("%d bytes, shorter than its checksum", len(raw)))
	}
	v := raw[:len(raw)-sumLen]
	stored := binary.BigEndian.Uint32(raw[len(v):])
	if got := valueSum(sumOf(bucket), key, v); got != stored {
		return nil, corruptValue(tx, bucket, key, fmt.Sprintf("checksum %08x stored, %08x computed", stored, got))
	}
	return v, nil
}

func corruptValue(tx *bolt.Tx, bucket []byte, key []byte, what string) error {
	name := fmt.Sprintf("%s/%s", bucket, printable(key))
	if bytes.Equal(bucket, bucketStreams) {
		if stream, seq, err := decodeEntryKey(key); err == nil {
			name = fmt.Sprintf("%s/%q seq %d", bucket, stream, seq)
		}
	}
	return &store.ChecksumError{File: tx.DB().Path(), Key: name, What: what}
}

// printable shows a key as text when it is, else in hex.
func printable(k []byte) string {
	for _, c := range k {
		if c < 0x20 || c > 0x7e {
			return fmt.Sprintf("%x", k)
		}
	}
	return fmt.Sprintf("%q", k)
}

// ErrNewerLayout reports a data file of a layout version this build does
// not know: a newer build wrote it. It is refused by every open, read-only
// or not, and left as it was.
var ErrNewerLayout = errors.New("store: the data file has a newer layout version than this build reads; run the participantd that wrote it, or a later one")

// format is how the values of one file are stored, read from its meta
// bucket at each transaction (readers of a file opened read-only may meet
// any version; a read-write open converts the file first, see Upgrade).
type format struct {
	version int
	// Between two transactions of an upgrade from version 1, the values
	// up to upKey of bucket upBucket (in upgradeOrder), and every value
	// of the buckets before it, are sealed; the others are not yet.
	upgrading bool
	upBucket  int
	upKey     []byte
}

// upgradeOrder is the order Upgrade seals the data buckets of a version 1
// file in; the meta bucket is sealed last, with the version.
var upgradeOrder = [][]byte{bucketStreams, bucketValues, bucketBytes}

// keyUpgrade is the meta key of a version 1 file whose upgrade is under
// way: a byte (the bucket's index in upgradeOrder) and the last key sealed
// in it, sealed itself.
var keyUpgrade = []byte("upgrade")

// sealed reports whether the value of key in bucket is sealed in f.
func (f format) sealed(bucket []byte, key []byte) bool {
	switch {
	case f.version >= 2:
		return true
	case !f.upgrading:
		return false
	}
	i := 0
	for i < len(upgradeOrder) && !bytes.Equal(upgradeOrder[i], bucket) {
		i++
	}
	if i == len(upgradeOrder) {
		return false // meta: sealed with the version
	}
	return i < f.upBucket || i == f.upBucket && bytes.Compare(key, f.upKey) <= 0
}

// encodeVersion is the value of the meta key "version": the version byte,
// sealed from version 2 on (version 1 was the byte alone).
func encodeVersion(v int) []byte {
	if v == 1 {
		return []byte{1}
	}
	return seal(sumMeta, keyVersion, []byte{byte(v)})
}

// current holds the open files (*bolt.DB, weakly) known to be of the
// current version, so that a transaction of one reads no meta bucket: a
// file's format never changes once it is current (nothing writes the
// version but the creation of a file and an upgrade to it, and a
// read-only open's shared lock keeps every writer out). An entry goes
// when its DB is collected.
var current sync.Map

// formatOf returns the format of tx's file, read from its meta bucket
// unless the file is known to be current: an unknown newer version is
// ErrNewerLayout, a version value that does not verify ErrCorrupt.
func formatOf(tx *bolt.Tx) (format, error) {
	db := tx.DB()
	key := weak.Make(db)
	if _, ok := current.Load(key); ok {
		return format{version: LayoutVersion}, nil
	}
	f, err := readFormat(tx)
	if err == nil && f.version == LayoutVersion {
		if _, loaded := current.LoadOrStore(key, struct{}{}); !loaded {
			runtime.AddCleanup(db, func(k weak.Pointer[bolt.DB]) { current.Delete(k) }, key)
		}
	}
	return f, err
}

func readFormat(tx *bolt.Tx) (format, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return format{}, errors.New("not a participantd store: no meta bucket")
	}
	raw := meta.Get(keyVersion)
	switch {
	case len(raw) == 1 && raw[0] == 1:
		f := format{version: 1}
		up := meta.Get(keyUpgrade)
		if up == nil {
			return f, nil
		}
		v, err := unseal(tx, bucketMeta, keyUpgrade, up)
		if err != nil {
			return format{}, err
		}
		if len(v) < 1 || int(v[0]) >= len(upgradeOrder) {
			return format{}, corruptValue(tx, bucketMeta, keyUpgrade, fmt.Sprintf("malformed %x", v))
		}
		f.upgrading, f.upBucket, f.upKey = true, int(v[0]), v[1:]
		return f, nil
	case len(raw) == 1+sumLen:
		v, err := unseal(tx, bucketMeta, keyVersion, raw)
		if err != nil {
			return format{}, err
		}
		switch {
		case int(v[0]) > LayoutVersion:
			return format{}, fmt.Errorf("%s: layout version %d, this build reads 1 to %d: %w", tx.DB().Path(), v[0], LayoutVersion, ErrNewerLayout)
		case v[0] < 2:
			return format{}, corruptValue(tx, bucketMeta, keyVersion, fmt.Sprintf("layout version %d sealed", v[0]))
		}
		return format{version: int(v[0])}, nil
	case len(raw) > 0 && int(raw[0]) > LayoutVersion:
		return format{}, fmt.Errorf("%s: layout version %d, this build reads 1 to %d: %w", tx.DB().Path(), raw[0], LayoutVersion, ErrNewerLayout)
	default:
		return format{}, corruptValue(tx, bucketMeta, keyVersion, fmt.Sprintf("unknown layout version %x", raw))
	}
}

// writable returns tx's format when values may be written in it: only a
// file of the current version is written (a read-write open upgrades an
// older one first).
func writable(tx *bolt.Tx) error {
	f, err := formatOf(tx)
	if err != nil {
		return err
	}
	if f.version != LayoutVersion {
		return fmt.Errorf("store: a write into a file of layout version %d, which must be upgraded first", f.version)
	}
	return nil
}

// landed checks the sum of the entry k, raw where a lookup of bucket
// landed, when there is one and f seals it. A bit flipped in a key leaves
// the entry in its place in the page, out of key order or out of the
// range it belonged to, and a search lands right beside that place: so a
// lookup that misses its key, or a walk that leaves its range, checks
// the entries around where it stopped, and a damaged key is an error
// instead of an absent value.
func (f format) landed(tx *bolt.Tx, bucket []byte, k, raw []byte) error {
	if k == nil || raw == nil || !f.sealed(bucket, k) {
		return nil
	}
	_, err := unseal(tx, bucket, k, raw)
	return err
}

// landedAt is landed for the entry k, raw at c's position and for the one
// before it, leaving c where it found it.
func (f format) landedAt(tx *bolt.Tx, bucket []byte, c *bolt.Cursor, k, raw []byte) error {
	if err := f.landed(tx, bucket, k, raw); err != nil {
		return err
	}
	var pk, pv []byte
	if k == nil {
		pk, pv = c.Last()
		if err := f.landed(tx, bucket, pk, pv); err != nil {
			return err
		}
		c.Next()
		return nil
	}
	pk, pv = c.Prev()
	if err := f.landed(tx, bucket, pk, pv); err != nil {
		return err
	}
	if pk == nil {
		c.First()
	} else {
		c.Next()
	}
	return nil
}

// value returns the bytes of raw, the stored value of key in bucket,
// checking its checksum where f seals it.
func (f format) value(tx *bolt.Tx, bucket []byte, key, raw []byte) ([]byte, error) {
	if raw == nil || !f.sealed(bucket, key) {
		return raw, nil
	}
	return unseal(tx, bucket, key, raw)
}
