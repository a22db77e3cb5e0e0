package boltfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/participantd/participantd/store"
)

// bbolt page layout, as bbolt v1.5 writes it:
//
//	page header (16 bytes): id u64, flags u16, count u16, overflow u32
//	branch element (16 bytes): pos u32, ksize u32, child pgid u64
//	leaf element   (16 bytes): flags u32, pos u32, ksize u32, vsize u32
//
// An element's key starts pos bytes after the element itself; a leaf's
// value follows its key. A leaf element with flag 1 is a bucket: its value
// is the bucket's root pgid and sequence (16 bytes), followed, when the root
// is 0, by the bucket's inline leaf page.
const (
	pageHeaderSize = 16
	elementSize    = 16
	branchFlag     = 0x01
	leafFlag       = 0x02
	bucketLeafFlag = 0x01
	// maxTreeDepth bounds a B+tree's height: every branch holds at least
	// two children, so no real tree of 2^64 pages is deeper.
	maxTreeDepth = 64
	// maxBucketDepth bounds the nesting of buckets (this package uses one
	// level).
	maxBucketDepth = 16
)

// pageWalker checks the structure of a bbolt file reachable from a meta
// page, reading it with pread rather than through a mapping: every page id
// below the high water mark, each page's header naming itself, a branch or
// leaf type, elements and keys inside their page, every page referenced
// once. bbolt trusts all of that: when it opens a file for writing it walks
// every page in a goroutine of its own, where an out-of-range page id is a
// fault, a page referenced twice a panic and a cycle an endless recursion,
// none of which a caller can contain. Key order and values are left to
// bbolt, whose complaints about them are contained (see Contain).
//
// A walk reads every page (full), or only the structure above the leaves
// of the buckets' trees (see walkFile).
type pageWalker struct {
	f       *os.File
	ps      uint64
	hwm     uint64
	full    bool
	visited []uint64 // bitset of page ids seen
	bufs    [][]byte // one page buffer per level being walked
	reads   int      // pages read, overflow pages not counted
}

// walkMode says how much of a file walkFile reads.
type walkMode int

const (
	// walkAll reads every reachable page: what bbolt itself reads when it
	// rebuilds the freelist of a file that has none persisted.
	walkAll walkMode = iota
	// walkStructure reads the root bucket's tree whole and, of every
	// bucket's tree, the branch pages and the first child of each lowest
	// branch; the other leaves of a bucket are only counted as referenced,
	// by id, not read. It reads about one page in a hundred of a big file
	// instead of all of them, and is what a read-write open of a file with
	// a persisted freelist needs (bbolt then reads that freelist instead
	// of walking the file).
	walkStructure
)

// walkModeFor returns the walk a read-write open of a file whose chosen
// meta is m needs before bbolt maps it: walkAll when bbolt will walk every
// page itself (no persisted freelist), else walkStructure.
func walkModeFor(m boltMeta) walkMode {
	if m.freelist == noFreelist {
		return walkAll
	}
	return walkStructure
}

// walkFile checks the page structure of the file at path, whose chosen
// meta page is m, reading as much of it as mode says. Damage is an error
// naming the page, to be wrapped in store.ErrCorrupt by the caller.
//
// A persisted freelist is read whole in either mode and checked: a
// freelist page, page ids below the high water mark in ascending order,
// none of them a page the walk found referenced. bbolt trusts it when it
// allocates, so a free id that is in use would let a commit overwrite
// live data. walkStructure cannot see the overflow pages of the leaves it
// does not read, nor damage inside them (a flipped type, a key out of
// place): such damage is found when bbolt reads the leaf (contained, see
// Contain) or by boltstore.Store.Check.
func walkFile(path string, m boltMeta, mode walkMode) error {
	_, err := walkPages(path, m, mode)
	return err
}

// walkPages is walkFile, also returning how many pages it read.
func walkPages(path string, m boltMeta, mode walkMode) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := &pageWalker{f: f, ps: uint64(m.pageSize), hwm: m.hwm, full: mode == walkAll, visited: make([]uint64, (m.hwm+63)/64)}
	var free []uint64
	if m.freelist != noFreelist {
		if free, err = w.freelist(m.freelist); err != nil {
			return w.reads, fmt.Errorf("freelist: %w", err)
		}
	}
	if _, err := w.tree(m.root, 0, 0); err != nil {
		return w.reads, err
	}
	for _, id := range free {
		if w.visited[id/64]&(1<<(id%64)) != 0 {
			return w.reads, fmt.Errorf("freelist: page %d is free and in use", id)
		}
	}
	return w.reads, nil
}

// freelistPageFlag is the type of bbolt's freelist page.
const freelistPageFlag = 0x10

// freelist reads and checks the freelist page id (with its overflow) and
// returns the free page ids it lists, in ascending order.
func (w *pageWalker) freelist(id uint64) ([]uint64, error) {
	page, err := w.read(id, 0)
	if err != nil {
		return nil, err
	}
	if flags := binary.LittleEndian.Uint16(page[8:]); flags != freelistPageFlag {
		return nil, fmt.Errorf("page %d: type %#x, not a freelist", id, flags)
	}
	body := page[pageHeaderSize:]
	n := uint64(binary.LittleEndian.Uint16(page[10:]))
	if n == 0xFFFF {
		// bbolt's escape for a count past 16 bits: the first id slot holds it.
		if len(body) < 8 {
			return nil, fmt.Errorf("page %d: no room for the count", id)
		}
		n = binary.LittleEndian.Uint64(body)
		body = body[8:]
	}
	if n > uint64(len(body))/8 {
		return nil, fmt.Errorf("page %d: %d ids do not fit its %d bytes", id, n, len(page))
	}
	free := make([]uint64, n)
	for i := range free {
		free[i] = binary.LittleEndian.Uint64(body[8*i:])
		if free[i] < 2 || free[i] >= w.hwm {
			return nil, fmt.Errorf("page %d: free page %d outside pages 2..%d", id, free[i], w.hwm-1)
		}
		if i > 0 && free[i] <= free[i-1] {
			return nil, fmt.Errorf("page %d: free page %d after %d, not ascending", id, free[i], free[i-1])
		}
	}
	return free, nil
}

// mark records pages id..id+overflow as referenced, refusing one out of
// range or seen before.
func (w *pageWalker) mark(id uint64, overflow uint32) error {
	if id < 2 || id >= w.hwm || uint64(overflow) >= w.hwm-id {
		return fmt.Errorf("page %d (+%d overflow) outside pages 2..%d", id, overflow, w.hwm-1)
	}
	for p := id; p <= id+uint64(overflow); p++ {
		if w.visited[p/64]&(1<<(p%64)) != 0 {
			return fmt.Errorf("page %d referenced twice", p)
		}
		w.visited[p/64] |= 1 << (p % 64)
	}
	return nil
}

// read returns page id with its overflow pages, in bufs[depth] when they
// fit a page: a walk holds one page per tree level at a time.
func (w *pageWalker) read(id uint64, depth int) ([]byte, error) {
	if id < 2 || id >= w.hwm {
		return nil, fmt.Errorf("page %d outside pages 2..%d", id, w.hwm-1)
	}
	for len(w.bufs) <= depth {
		w.bufs = append(w.bufs, make([]byte, w.ps))
	}
	page := w.bufs[depth]
	w.reads++
	if _, err := w.f.ReadAt(page, int64(id*w.ps)); err != nil {
		return nil, fmt.Errorf("page %d: %w", id, err)
	}
	if got := binary.LittleEndian.Uint64(page); got != id {
		return nil, fmt.Errorf("page %d calls itself page %d", id, got)
	}
	overflow := binary.LittleEndian.Uint32(page[12:])
	if err := w.mark(id, overflow); err != nil {
		return nil, err
	}
	if overflow > 0 {
		page = make([]byte, (1+uint64(overflow))*w.ps)
		if _, err := w.f.ReadAt(page, int64(id*w.ps)); err != nil {
			return nil, fmt.Errorf("page %d: %w", id, err)
		}
	}
	return page, nil
}

// tree checks the B+tree rooted at page id, depth levels below its
// bucket's root, in a bucket nested nest levels deep, and reports whether
// page id is a leaf. Unless the walk is full, a branch of a nested
// bucket whose first child is a leaf has its other children counted by
// id and not read: bbolt's trees are balanced, so they are leaves too,
// and the leaves are almost all of a big file.
func (w *pageWalker) tree(id uint64, depth, nest int) (bool, error) {
	if depth > maxTreeDepth {
		return false, fmt.Errorf("page %d: tree deeper than %d", id, maxTreeDepth)
	}
	page, err := w.read(id, depth+nest*(maxTreeDepth+1))
	if err != nil {
		return false, err
	}
	flags := binary.LittleEndian.Uint16(page[8:])
	count := int(binary.LittleEndian.Uint16(page[10:]))
	if pageHeaderSize+count*elementSize > len(page) {
		return false, fmt.Errorf("page %d: %d elements do not fit", id, count)
	}
	switch flags {
	case branchFlag:
		if count == 0 {
			return false, fmt.Errorf("page %d: empty branch", id)
		}
		skipLeaves := false
		for i := range count {
			e := page[pageHeaderSize+i*elementSize:]
			if err := inside(page, pageHeaderSize+i*elementSize, binary.LittleEndian.Uint32(e), uint64(binary.LittleEndian.Uint32(e[4:]))); err != nil {
				return false, fmt.Errorf("page %d element %d: %w", id, i, err)
			}
			child := binary.LittleEndian.Uint64(e[8:])
			if skipLeaves {
				if err := w.mark(child, 0); err != nil {
					return false, fmt.Errorf("page %d element %d: %w", id, i, err)
				}
				continue
			}
			leaf, err := w.tree(child, depth+1, nest)
			if err != nil {
				return false, err
			}
			skipLeaves = leaf && !w.full && nest > 0
		}
		return false, nil
	case leafFlag:
		return true, w.leaf(page, count, nest, fmt.Sprintf("page %d", id))
	}
	return false, fmt.Errorf("page %d: type %#x, neither branch nor leaf", id, flags)
}

// leaf checks the count elements of a leaf page (a real one or a bucket's
// inline page) and the buckets they hold.
func (w *pageWalker) leaf(page []byte, count, nest int, where string) error {
	for i := range count {
		off := pageHeaderSize + i*elementSize
		e := page[off:]
		pos, ksize, vsize := binary.LittleEndian.Uint32(e[4:]), binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])
		if err := inside(page, off, pos, uint64(ksize)+uint64(vsize)); err != nil {
			return fmt.Errorf("%s element %d: %w", where, i, err)
		}
		if binary.LittleEndian.Uint32(e)&bucketLeafFlag == 0 {
			continue
		}
		start := off + int(pos) + int(ksize)
		v := page[start : start+int(vsize)]
		if len(v) < 16 {
			return fmt.Errorf("%s element %d: bucket value of %d bytes", where, i, len(v))
		}
		if nest+1 > maxBucketDepth {
			return fmt.Errorf("%s element %d: buckets nested deeper than %d", where, i, maxBucketDepth)
		}
		if root := binary.LittleEndian.Uint64(v); root != 0 {
			if _, err := w.tree(root, 0, nest+1); err != nil {
				return err
			}
			continue
		}
		inline := v[16:]
		if len(inline) < pageHeaderSize {
			return fmt.Errorf("%s element %d: inline bucket of %d bytes", where, i, len(inline))
		}
		n := int(binary.LittleEndian.Uint16(inline[10:]))
		if binary.LittleEndian.Uint16(inline[8:]) != leafFlag || pageHeaderSize+n*elementSize > len(inline) {
			return fmt.Errorf("%s element %d: malformed inline bucket", where, i)
		}
		if err := w.leaf(inline, n, nest+1, fmt.Sprintf("%s element %d inline bucket", where, i)); err != nil {
			return err
		}
	}
	return nil
}

// inside checks that the size bytes at pos bytes after offset off lie
// inside page.
func inside(page []byte, off int, pos uint32, size uint64) error {
	if end := uint64(off) + uint64(pos) + uint64(size); end > uint64(len(page)) {
		return fmt.Errorf("key or value at %d+%d, %d bytes, past the page's %d bytes", off, pos, size, len(page))
	}
	return nil
}

// CheckAtRest checks the file at path, held so that no writer changes it:
// its meta pages and size, then its page structure. Damage wraps
// store.ErrCorrupt.
func CheckAtRest(path string) error {
	state, m, err := checkFile(path)
	if err != nil {
		return err
	}
	if state != fileValid {
		return fmt.Errorf("%s: emptied while opening: %w", path, store.ErrNoData)
	}
	if err := walkFile(path, m, walkAll); err != nil {
		return fmt.Errorf("%s: %w: %w", path, err, store.ErrCorrupt)
	}
	return nil
}

// lockedByWriter reports whether another opener holds path for writing:
// a read-only bbolt open, which reads only the meta pages, cannot get its
// shared lock.
func lockedByWriter(path string) bool {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 10 * time.Millisecond})
	if err == nil {
		db.Close()
	}
	return errors.Is(err, berrors.ErrTimeout)
}
