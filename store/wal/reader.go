package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/participantd/participantd/store/vfs"
)

// readChunk is the size of the window a segment is read through: a
// replay holds this much of a segment at a time, and a record larger than
// it alone, never the whole (preallocated, mostly zero) segment.
const readChunk = 1 << 20

// segmentReader reads one segment file through a window of chunk bytes.
// A slice it returns is valid until its next read: the window's buffer is
// reused. A read larger than chunk gets a buffer of its own, never reused,
// so a record read that way may be kept by the caller.
//
// When w is set (Open), the bytes marked with keep, the records a replay
// gave to apply, are written over themselves before the window moves
// past them: the bytes written are the very bytes checked and applied
// (see Open).
type segmentReader struct {
	f     io.ReaderAt
	name  string // the segment's base name, for errors
	size  int64
	chunk int64

	win    []byte // the file's bytes at winOff
	winOff int64
	buf    []byte // the reused window buffer, of chunk bytes

	w            io.WriterAt
	wbFrom, wbTo int64 // kept bytes not yet written back, inside the window
}

// openSegment opens the segment at path for reading, and for writing
// back when rw is set; the caller closes the returned file.
func openSegment(fsys vfs.FS, path, name string, rw bool) (*segmentReader, vfs.File, error) {
	open := fsys.Open
	if rw {
		open = fsys.OpenRW
	}
	f, err := open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("wal: open %s: %w", path, err)
	}
	size, err := f.Size()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("wal: stat %s: %w", path, err)
	}
	r := newSegmentReader(f, name, size, readChunk)
	if rw {
		r.w = f
	}
	return r, f, nil
}

func newSegmentReader(f io.ReaderAt, name string, size, chunk int64) *segmentReader {
	return &segmentReader{f: f, name: name, size: size, chunk: chunk}
}

// errTooLargeHere reports a read this platform cannot address in memory.
var errTooLargeHere = errors.New("too large to read into memory on this platform")

// at returns the n bytes of the segment at off, which the caller has
// checked lie inside it.
func (r *segmentReader) at(off, n int64) ([]byte, error) {
	if off >= r.winOff && off+n <= r.winOff+int64(len(r.win)) {
		return r.win[off-r.winOff:][:n], nil
	}
	if err := r.flush(); err != nil {
		return nil, err
	}
	if n > math.MaxInt {
		return nil, fmt.Errorf("wal: read %s at %d: %d bytes: %w", r.name, off, n, errTooLargeHere)
	}
	var buf []byte
	if n > r.chunk {
		buf = make([]byte, n)
	} else {
		if r.buf == nil {
			r.buf = make([]byte, r.chunk)
		}
		buf = r.buf[:max(n, min(r.chunk, r.size-off))]
	}
	// The window is empty until the read succeeds: a failed read leaves
	// nothing a later call could take for the file's bytes.
	r.win, r.winOff = nil, 0
	if k, err := r.f.ReadAt(buf, off); k < len(buf) || (err != nil && !errors.Is(err, io.EOF)) {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("wal: read %s at %d: %w", r.name, off, err)
	}
	r.win, r.winOff = buf, off
	return buf[:n], nil
}

// keep marks the window's bytes [off, end) to be written over themselves
// before the window moves on, when the reader writes back.
func (r *segmentReader) keep(off, end int64) error {
	if r.w == nil {
		return nil
	}
	if off != r.wbTo {
		if err := r.flush(); err != nil {
			return err
		}
		r.wbFrom = off
	}
	r.wbTo = end
	return nil
}

// flush writes the kept bytes of the window over themselves.
func (r *segmentReader) flush() error {
	if r.wbTo <= r.wbFrom {
		return nil
	}
	b := r.win[r.wbFrom-r.winOff : r.wbTo-r.winOff]
	if _, err := r.w.WriteAt(b, r.wbFrom); err != nil {
		return fmt.Errorf("wal: rewrite %s at %d: %w", r.name, r.wbFrom, err)
	}
	r.wbFrom = r.wbTo
	return nil
}

// crc continues c, a CRC-32C, over the n bytes at off, a window at a time.
func (r *segmentReader) crc(c uint32, off, n int64) (uint32, error) {
	for n > 0 {
		k := min(n, r.chunk)
		b, err := r.at(off, k)
		if err != nil {
			return 0, err
		}
		c = crc32.Update(c, castagnoli, b)
		off, n = off+k, n-k
	}
	return c, nil
}

// frameLen returns the body length the frame at off claims, and false
// when no frame of that length fits the segment there.
func (r *segmentReader) frameLen(off int64) (int64, bool, error) {
	if off+frameHeaderLen > r.size {
		return 0, false, nil
	}
	h, err := r.at(off, frameHeaderLen)
	if err != nil {
		return 0, false, err
	}
	n := int64(binary.LittleEndian.Uint32(h))
	return n, n >= minBodyLen && off+frameHeaderLen+n <= r.size, nil
}

// validFrame reports whether a valid frame starts at off, checking its
// CRC a window at a time: a frame whose length field claims most of the
// segment costs no buffer of that size.
func (r *segmentReader) validFrame(off int64) (bool, error) {
	n, ok, err := r.frameLen(off)
	if !ok || err != nil {
		return false, err
	}
	h, err := r.at(off, frameHeaderLen)
	if err != nil {
		return false, err
	}
	want := binary.LittleEndian.Uint32(h[4:])
	c, err := r.crc(crc32.Checksum(h[:4], castagnoli), off+frameHeaderLen, n)
	return err == nil && c == want, err
}

// frame returns the valid frame at off, its header and body, and the
// offset just past it; errNoFrame when there is none. A frame larger
// than the window is read into a buffer of its own, and only once its
// CRC held a window at a time.
func (r *segmentReader) frame(off int64) ([]byte, int64, error) {
	n, ok, err := r.frameLen(off)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		return nil, 0, errNoFrame
	}
	if frameHeaderLen+n > r.chunk {
		if ok, err := r.validFrame(off); err != nil || !ok {
			return nil, 0, cmpErr(err, errNoFrame)
		}
	}
	f, err := r.at(off, frameHeaderLen+n)
	if err != nil {
		return nil, 0, err
	}
	// The bytes are checked again as read: they are what is applied.
	if _, _, err := readFrame(f, 0); err != nil {
		return nil, 0, err
	}
	return f, off + frameHeaderLen + n, nil
}

// cmpErr returns err, or otherwise when err is nil.
func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// peek returns the LSN of the body of a known version at off, without
// checking the CRC.
func (r *segmentReader) peek(off int64) (LSN, bool, error) {
	if off+frameHeaderLen+minBodyLen > r.size {
		return 0, false, nil
	}
	b, err := r.at(off, frameHeaderLen+minBodyLen)
	if err != nil {
		return 0, false, err
	}
	lsn, ok := peekLSN(b, 0)
	return lsn, ok, nil
}
