package boltfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// bbolt's on-disk meta page, as bbolt v1.5 writes it (little-endian on every
// platform this runs on). Pages 0 and 1 each hold a meta; a commit rewrites
// the one of its txid's parity, so at least one is whole after a crash.
//
//	offset  size  field
//	0       16    page header: id, flags (0x04 = meta), count, overflow
//	16      4     magic 0xED0CDAED
//	20      4     version (2)
//	24      4     page size
//	28      4     flags
//	32      16    root bucket: root pgid, sequence
//	48      8     freelist pgid (2^64-1: not persisted)
//	56      8     high water mark: pages in use
//	64      8     txid
//	72      8     checksum: FNV-64a of bytes 16..72
const (
	metaOffset    = 16
	metaSumOffset = 72
	metaEnd       = 80
	boltMagic     = 0xED0CDAED
	boltVersion   = 2
	noFreelist    = ^uint64(0)
	// minPageSize and maxPageSize bound the page sizes bbolt can have
	// written (it probes 1 KiB .. 16 MiB for the second meta page).
	minPageSize = 1 << 10
	maxPageSize = 1 << 24
)

// boltMeta is the part of a meta page the pre-open check uses.
type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	hwm      uint64 // high water mark: pages 0..hwm-1 are in use
	txid     uint64
}

// parseMeta decodes and validates the meta page at the start of page,
// as bbolt's Meta.Validate does, plus the bounds bbolt asserts only when it
// writes a meta.
func parseMeta(page []byte) (boltMeta, error) {
	if len(page) < metaEnd {
		return boltMeta{}, errors.New("short meta page")
	}
	le := binary.LittleEndian
	if m := le.Uint32(page[metaOffset:]); m != boltMagic {
		return boltMeta{}, fmt.Errorf("bad magic %#x", m)
	}
	if v := le.Uint32(page[metaOffset+4:]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("unsupported bbolt version %d", v)
	}
	h := fnv.New64a()
	h.Write(page[metaOffset:metaSumOffset])
	if sum := le.Uint64(page[metaSumOffset:]); sum != h.Sum64() {
		return boltMeta{}, fmt.Errorf("checksum %#x, computed %#x", sum, h.Sum64())
	}
	m := boltMeta{
		pageSize: le.Uint32(page[metaOffset+8:]),
		root:     le.Uint64(page[metaOffset+16:]),
		freelist: le.Uint64(page[metaOffset+32:]),
		hwm:      le.Uint64(page[metaOffset+40:]),
		txid:     le.Uint64(page[metaOffset+48:]),
	}
	if m.pageSize < minPageSize || m.pageSize > maxPageSize || m.pageSize&(m.pageSize-1) != 0 {
		return boltMeta{}, fmt.Errorf("page size %d", m.pageSize)
	}
	if m.hwm < 2 || m.root >= m.hwm || (m.freelist != noFreelist && m.freelist >= m.hwm) {
		return boltMeta{}, fmt.Errorf("root page %d or freelist page %d not below the high water mark %d", m.root, m.freelist, m.hwm)
	}
	return m, nil
}

// Meta is the meta page bbolt uses for a file, for tools and tests that
// inspect or damage a file precisely.
type Meta struct {
	PageSize uint32
	Root     uint64
	// Freelist is the page of the persisted freelist, NoFreelist when
	// the file has none.
	Freelist uint64
	// HighWater is the pages in use: 0..HighWater-1.
	HighWater uint64
	TxID      uint64
}

// NoFreelist is Meta.Freelist of a file without a persisted freelist.
const NoFreelist = noFreelist

func (m boltMeta) export() Meta {
	return Meta{PageSize: m.pageSize, Root: m.root, Freelist: m.freelist, HighWater: m.hwm, TxID: m.txid}
}

// ParseMeta decodes and validates one meta page at the start of page, as
// bbolt does.
func ParseMeta(page []byte) (Meta, error) {
	m, err := parseMeta(page)
	return m.export(), err
}

// MetaOf returns the meta page bbolt would use for the file at path, after
// the checks of CheckFile that precede the page walk: damage is an error
// wrapping store.ErrCorrupt, a missing or 0-byte file store.ErrNoData.
func MetaOf(path string) (Meta, error) {
	state, m, err := checkFile(path)
	if err != nil {
		return Meta{}, err
	}
	if state != fileValid {
		return Meta{}, fmt.Errorf("%s: %w", path, store.ErrNoData)
	}
	return m.export(), nil
}

// fileState is what checkFile found.
type fileState int

const (
	fileAbsent fileState = iota
	fileEmpty            // 0 bytes: bbolt would initialize it
	fileValid            // passes every check below
)

// checkFile checks the data file at path before bbolt maps it, so that a
// damaged file is an error that names it instead of a SIGBUS or a panic
// inside bbolt: bbolt maps the file and reads pages through the mapping,
// and a page past the end of the file faults.
//
// A valid file has at least two pages, a size that is a multiple of the
// page size, a meta page that bbolt will use (the one with the higher txid
// among the valid ones, as bbolt chooses) and that size covers that meta's
// high water mark. It returns that meta for a valid file. Damage is
// reported wrapping store.ErrCorrupt; an absent or 0-byte file is not an error
// here.
func checkFile(path string) (fileState, boltMeta, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileAbsent, boltMeta{}, nil
	}
	if err != nil {
		return 0, boltMeta{}, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return 0, boltMeta{}, err
	}
	size := info.Size()
	if size == 0 {
		return fileEmpty, boltMeta{}, nil
	}
	corrupt := func(format string, args ...any) (fileState, boltMeta, error) {
		return 0, boltMeta{}, fmt.Errorf("%s (%d bytes): %s: %w", path, size, fmt.Sprintf(format, args...), store.ErrCorrupt)
	}
	buf := make([]byte, metaEnd)
	if _, err := f.ReadAt(buf, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return corrupt("shorter than a meta page")
		}
		return 0, boltMeta{}, err
	}
	m0, err0 := parseMeta(buf)
	// Page 1's offset is the page size; page 0 says what it is, and when
	// page 0 is damaged every size bbolt could have used is tried, as
	// bbolt does.
	sizes := []int64{}
	if err0 == nil {
		sizes = append(sizes, int64(m0.pageSize))
	} else {
		for ps := int64(minPageSize); ps <= maxPageSize; ps <<= 1 {
			sizes = append(sizes, ps)
		}
	}
	var m1 boltMeta
	err1 := errors.New("no second meta page")
	for _, ps := range sizes {
		if ps+metaEnd > size {
			break
		}
		if _, err := f.ReadAt(buf, ps); err != nil {
			return 0, boltMeta{}, err
		}
		if m, err := parseMeta(buf); err == nil && int64(m.pageSize) == ps {
			m1, err1 = m, nil
			break
		} else if err == nil {
			err = fmt.Errorf("page size %d at offset %d", m.pageSize, ps)
			err1 = err
		} else {
			err1 = err
		}
	}
	var m boltMeta
	switch {
	case err0 != nil && err1 != nil:
		return corrupt("both meta pages are invalid: page 0: %v; page 1: %v", err0, err1)
	case err0 == nil && err1 == nil:
		if m0.pageSize != m1.pageSize {
			return corrupt("meta pages disagree on the page size: %d and %d", m0.pageSize, m1.pageSize)
		}
		m = m0
		if m1.txid > m0.txid {
			m = m1
		}
	case err0 == nil:
		m = m0
	default:
		m = m1
	}
	ps := int64(m.pageSize)
	switch {
	case size < 2*ps:
		return corrupt("shorter than two %d-byte pages", ps)
	case size%ps != 0:
		return corrupt("not a multiple of the %d-byte page size", ps)
	case uint64(size/ps) < m.hwm:
		return corrupt("truncated: the meta page of txid %d uses %d pages, the file holds %d", m.txid, m.hwm, size/ps)
	}
	return fileValid, m, nil
}

// SyncDir fsyncs directory dir, making the entries created in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	cerr := d.Close()
	return errors.Join(serr, cerr)
}

// CheckKeys checks, in read transaction tx, the layout and that every key
// and value of every bucket has this package's layout, and that every
// value sealed with a checksum (layout version 2) matches it, reading each
// once. It returns the first damage found: a checksum mismatch is a
// *store.ChecksumError.
func CheckKeys(tx *bolt.Tx) error {
	if err := CheckLayout(tx); err != nil {
		return err
	}
	f, err := formatOf(tx)
	if err != nil {
		return err
	}
	for _, bucket := range [][]byte{bucketStreams, bucketValues, bucketBytes, bucketMeta} {
		b := tx.Bucket(bucket)
		if b == nil {
			continue // bytes, before the first PutBytes (CheckLayout checked the others)
		}
		var prev []byte
		err := b.ForEach(func(k, raw []byte) error {
			// bbolt walks a bucket in page order: keys out of ascending
			// order are a damaged key, which bbolt's searches would step
			// past.
			if prev != nil && bytes.Compare(prev, k) >= 0 {
				return fmt.Errorf("%s: key %x after %x: out of order: %w", bucket, k, prev, store.ErrCorrupt)
			}
			prev = append(prev[:0], k...)
			return checkEntry(f, tx, bucket, k, raw)
		})
		if err != nil {
			return fmt.Errorf("%s bucket: %w", bucket, err)
		}
	}
	return nil
}

// checkEntry checks key k and stored value raw of bucket in tx, a file of
// format f (CheckKeys).
func checkEntry(f format, tx *bolt.Tx, bucket, k, raw []byte) error {
	switch string(bucket) {
	case "streams":
		if _, _, err := decodeEntryKey(k); err != nil {
			return err
		}
	case "values":
		if len(k) == 0 || len(k) > store.MaxNameLen {
			return fmt.Errorf("values: key of %d bytes", len(k))
		}
	}
	if raw == nil {
		return fmt.Errorf("%s: key %q is a bucket", bucket, k)
	}
	if bytes.Equal(bucket, bucketMeta) && (bytes.Equal(k, keyVersion) || bytes.Equal(k, keyUpgrade)) {
		return nil // read by formatOf
	}
	v, err := f.value(tx, bucket, k, raw)
	if err == nil && bytes.Equal(bucket, bucketValues) {
		_, err = decodeValue(string(k), v)
	}
	return err
}
