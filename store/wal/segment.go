package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/participantd/participantd/store/vfs"
)

// segmentMagic opens every segment file; its last byte is the segment
// format version, the newest of which is what this binary writes.
var segmentMagic = [8]byte{'p', 'd', 'w', 'a', 'l', 0, 0, segmentFormat2}

// Segment formats: 1 frames each record with one length and one CRC; 2
// cuts it into fragments stamped and checked sector by sector (sector.go).
// Both are read; only 2 is written.
const (
	segmentFormat1 = 1
	segmentFormat2 = 2
)

// segmentHeaderLen is the magic and the segment's first LSN.
const segmentHeaderLen = 16

const segmentSuffix = ".wal"

// segment is one segment file of the log.
type segment struct {
	name  string // base name, <first LSN as 16 hex digits>.wal
	first LSN    // the LSN of its first record, from its name
}

func segmentName(first LSN) string { return fmt.Sprintf("%016x%s", uint64(first), segmentSuffix) }

// parseSegmentName returns the first LSN of a segment file name.
func parseSegmentName(name string) (LSN, bool) {
	hex, ok := strings.CutSuffix(name, segmentSuffix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0, false
	}
	return LSN(v), true
}

func segmentHeader(first LSN) []byte { return formatHeader(first, segmentMagic[7]) }

// formatHeader returns the header of a segment of format version v.
func formatHeader(first LSN, v byte) []byte {
	h := make([]byte, segmentHeaderLen)
	copy(h, segmentMagic[:7])
	h[7] = v
	binary.LittleEndian.PutUint64(h[8:], uint64(first))
	return h
}

// listSegments returns the segment files of dir in LSN order. Files that
// are not segments are ignored.
func listSegments(fs vfs.FS, dir string) ([]segment, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: list %s: %w", dir, err)
	}
	var segs []segment
	for _, n := range names {
		if first, ok := parseSegmentName(n); ok {
			segs = append(segs, segment{name: n, first: first})
		}
	}
	// Names are fixed-width hex, so List's sorted order is LSN order.
	return segs, nil
}

// ErrUnknownVersion reports a segment whose magic names a segment
// format this binary does not know (written by a newer one): its records
// cannot be read, so the log is refused, never cut. It wraps ErrCorrupt.
var ErrUnknownVersion = fmt.Errorf("%w: unknown segment format version", ErrCorrupt)

// halfCreated reports whether buf, a segment file's content, is what a
// crash can leave of a segment whose creation did not finish: the file
// is shorter than a header, or its header is a prefix of the one it was
// to get (of either format: an older binary may have been creating it),
// zeros after. A torn write of the header leaves nothing else: a prefix
// of it, or its sector whole or not at all.
func halfCreated(buf []byte, first LSN) bool {
	return halfOf(buf, formatHeader(first, segmentFormat1)) || halfOf(buf, formatHeader(first, segmentFormat2))
}

// halfOf reports whether buf's header is a strict prefix of want, zeros
// after.
func halfOf(buf, want []byte) bool {
	h := buf[:min(len(buf), segmentHeaderLen)]
	i := 0
	for i < len(h) && h[i] == want[i] {
		i++
	}
	for _, c := range h[i:] {
		if c != 0 {
			return false
		}
	}
	return i < segmentHeaderLen
}

// checkVersion fails with ErrUnknownVersion when buf's magic is this
// format's but for its version byte, which is neither this version nor
// zero (a torn write of it).
func checkVersion(seg segment, buf []byte) error {
	if len(buf) < len(segmentMagic) || [7]byte(buf[:7]) != [7]byte(segmentMagic[:7]) {
		return nil
	}
	if v := buf[7]; v != 0 && v != segmentFormat1 && v != segmentFormat2 {
		return &CorruptionError{Segment: seg.name, Offset: 7, Reason: fmt.Sprintf("segment format version %d; this binary reads versions %d and %d "+
			"(written by a newer version: run that one, or restore a backup of the data directory)", v, segmentFormat1, segmentFormat2), err: ErrUnknownVersion}
	}
	return nil
}

// segmentScan is what scanning one segment found.
type segmentScan struct {
	// headerOK is false when the file is too short for a header or its
	// magic is wrong.
	headerOK bool
	// from is the offset of the first record with an LSN after the
	// replay's start (end when there is none): from there to end are the
	// records written back over themselves when the reader writes back.
	from int64
	// end is the offset just past the last valid record (the header's end
	// when there is none).
	end int64
	// records is the number of valid records.
	records int
	// last is the LSN of the last valid record.
	last LSN
	// torn is true when bytes after end are not zero: an unfinished
	// record.
	torn bool
	// f is the segment, open for writing, when Open scanned it to write
	// its records back; nil otherwise.
	f vfs.File
}

// scanSegment walks the records of the segment r reads, checking that
// LSNs follow expect, and calls apply for each after after, having marked
// it for r to write back. A bad record followed by a valid one is
// corruption; a bad record at the end is reported as torn and left to the
// caller, which knows whether the segment is the last. The batches given
// to apply alias buffers r never reuses.
func scanSegment(seg segment, r *segmentReader, expect, after LSN, apply func(*Batch) error) (segmentScan, error) {
	var sc segmentScan
	head, err := r.at(0, min(r.size, segmentHeaderLen))
	if err != nil {
		return sc, err
	}
	if err := checkVersion(seg, head); err != nil {
		return sc, err
	}
	if halfCreated(head, seg.first) {
		// A header is synced before any record goes in, so a bad header
		// with bytes after it was damaged, not left unfinished.
		at, err := lastNonZero(r, segmentHeaderLen)
		if err != nil {
			return sc, err
		}
		if at >= segmentHeaderLen {
			return sc, corrupt(seg, 0, fmt.Sprintf("bad segment header followed by bytes at offset %d", at))
		}
		return sc, nil
	}
	if len(head) < segmentHeaderLen || [7]byte(head[:7]) != [7]byte(segmentMagic[:7]) || (head[7] != segmentFormat1 && head[7] != segmentFormat2) {
		// Not what a torn write of the header leaves: damaged.
		return sc, corrupt(seg, 0, fmt.Sprintf("bad segment header %x", head))
	}
	sc.headerOK = true
	if h := LSN(binary.LittleEndian.Uint64(head[8:])); h != seg.first {
		return sc, corrupt(seg, 8, fmt.Sprintf("header LSN %v differs from the name's", h))
	}
	if seg.first != expect {
		return sc, corrupt(seg, 0, fmt.Sprintf("LSN gap: segment starts at %v, want %v", seg.first, expect))
	}
	if head[7] == segmentFormat2 {
		return scanSectors(seg, r, sc, expect, after, apply)
	}
	sc, expect, last, err := walkRecords(seg, r, sc, expect, after, apply, func(off int64, _ LSN) ([]byte, int64, bool, bool, error) {
		frame, end, err := r.frame(off)
		if errors.Is(err, errNoFrame) {
			return nil, 0, false, false, nil
		}
		if err != nil {
			return nil, 0, false, false, err
		}
		body := frame[frameHeaderLen:]
		applied := LSN(binary.LittleEndian.Uint64(body[1:])) > after
		if applied && int64(len(frame)) <= r.chunk {
			// The window is reused; apply may keep what it is given.
			body = bytes.Clone(body)
		}
		return body, end, applied, true, nil
	})
	if err != nil || !sc.torn {
		return sc, err
	}
	at, ok, err := laterRecord(r, sc.end, last, expect)
	if err != nil {
		return sc, err
	}
	if ok {
		return sc, corrupt(seg, sc.end, fmt.Sprintf("bad record followed by a valid one at offset %d", at))
	}
	return sc, nil
}

// walkRecords is the walk of a segment's records both formats share,
// from the end of its header: next reads the record at off, which should
// be the record of LSN expect, and returns where it ends, whether apply
// is given it (its LSN is after after), and false past the last valid
// record; and its body, the body's own since apply may keep it, or for a
// record apply is not given at least the body's first minBodyLen bytes
// (version and LSN), which may alias r's window. Each record's LSN must
// follow the one before it; a record after after is decoded, marked for
// r to write back, then given to apply; one at or below after, whose
// checks held, is not decoded: nothing reads its content. Once what
// apply was given is written back, the segment must be zeros past the
// last valid record, as preallocated, unless a record was torn or
// damaged there: walkRecords sets sc.torn when it is not, and returns
// the LSN the next record would have and the offset of the last byte
// that is not zero.
func walkRecords(seg segment, r *segmentReader, sc segmentScan, expect, after LSN, apply func(*Batch) error,
	next func(off int64, expect LSN) (body []byte, end int64, applied, ok bool, err error)) (segmentScan, LSN, int64, error) {
	off := int64(segmentHeaderLen)
	sc.from = -1
	for {
		body, end, applied, ok, err := next(off, expect)
		if err != nil {
			return sc, expect, 0, err
		}
		if !ok {
			break
		}
		var b *Batch
		lsn, err := bodyLSN(body)
		if err == nil && applied {
			b, err = decodeBody(body)
		}
		if err != nil {
			return sc, expect, 0, corrupt(seg, off, err.Error())
		}
		if lsn != expect {
			return sc, expect, 0, corrupt(seg, off, fmt.Sprintf("LSN gap: record %v, want %v", lsn, expect))
		}
		if applied {
			if sc.from < 0 {
				sc.from = off
			}
			if err := r.keep(off, end); err != nil {
				return sc, expect, 0, err
			}
			if err := apply(b); err != nil {
				return sc, expect, 0, err
			}
		}
		sc.records++
		sc.last = lsn
		expect++
		off = end
	}
	// What apply was given is written back before r reads past it.
	if err := r.flush(); err != nil {
		return sc, expect, 0, err
	}
	sc.end = off
	if sc.from < 0 {
		sc.from = off
	}
	last, err := lastNonZero(r, off)
	if err != nil {
		return sc, expect, 0, err
	}
	sc.torn = last >= off
	return sc, expect, last, nil
}

// lastNonZero returns the offset of the last byte of the segment at or
// after off that is not zero, or off-1 when there is none. A preallocated
// segment is mostly zeros, and every start looks at all of them: it reads
// them a window at a time from the end, and compares whole blocks at once
// (a vectorised compare) rather than byte by byte, which took seconds
// over 64 MiB under the race detector.
func lastNonZero(r *segmentReader, off int64) (int64, error) {
	end := r.size
	for end > off {
		start := max(off, end-r.chunk)
		buf, err := r.at(start, end-start)
		if err != nil {
			return 0, err
		}
		if i := lastNonZeroIn(buf); i >= 0 {
			return start + int64(i), nil
		}
		end = start
	}
	return off - 1, nil
}

// lastNonZeroIn returns the index of the last byte of buf that is not
// zero, or -1.
func lastNonZeroIn(buf []byte) int {
	end := len(buf)
	for end > 0 {
		start := max(0, end-zeroBlock)
		if !bytes.Equal(buf[start:end], zeros[:end-start]) {
			for i := end - 1; ; i-- {
				if buf[i] != 0 {
					return i
				}
			}
		}
		end = start
	}
	return -1
}

// zeroBlock is the size of the blocks lastNonZero compares with zeros.
const zeroBlock = 64 << 10

var zeros [zeroBlock]byte

// sectorSize is the unit a disk writes atomically, and faultfs's block:
// a torn write keeps or loses each of a record's sectors whole, or keeps
// a prefix of the record.
const sectorSize = 512

// laterRecord reports whether a valid frame after the bad record at off,
// at or before limit, proves that record damaged rather than torn. The
// bytes of a torn record are its own, and a client's payload may hold any
// frame at all: a frame within the record's reach is no evidence, unless
// the record's CRC shows it whole but for its length field, which should
// have ended where the frame starts.
func laterRecord(r *segmentReader, off, limit int64, expect LSN) (int64, bool, error) {
	reach, err := tornReach(r, off)
	if err != nil {
		return 0, false, err
	}
	return validFrameAfter(r, off, limit, expect, func(p int64) (bool, error) {
		if p >= reach {
			return true, nil
		}
		return wholeBut(r, off, p, expect)
	})
}

// validFrameAfter returns the first p after off and at or before limit
// where a valid frame with LSN expect or expect+1 starts and evidence(p)
// holds: such a frame would be a record written after the bad one at off.
func validFrameAfter(r *segmentReader, off, limit int64, expect LSN, evidence func(p int64) (bool, error)) (int64, bool, error) {
	for p := off + 1; p <= limit && p+frameHeaderLen+minBodyLen <= r.size; p++ {
		lsn, ok, err := r.peek(p)
		if err != nil {
			return 0, false, err
		}
		if !ok || (lsn != expect && lsn != expect+1) {
			continue
		}
		valid, err := r.validFrame(p)
		if err == nil && valid {
			valid, err = evidence(p)
		}
		if err != nil {
			return 0, false, err
		}
		if valid {
			return p, true, nil
		}
	}
	return 0, false, nil
}

// tornReach returns the offset below which a torn write of the record at
// off may have left bytes: off+1 when its length field proves it damaged
// (no torn write leaves it so), size+1 when the reach is unknown.
//
// A record is written in one pwrite over the segment's preallocated zeros
// and never past the segment's end. A torn write (a prefix, or any subset
// of whole sectors) leaves each of its bytes written or zero; a length
// field inside one sector is then either the record's own or zero. So:
//
//	length field                       reach
//	runs past the segment's end        damaged: off+1 (tearing only lowers it)
//	straddles two sectors              unknown: one part may be lost
//	zero, its sector otherwise zero    unknown: the sector was lost
//	zero, with bytes in its sector     damaged: off+1
//	n                                  off+8+n, the record's own end
func tornReach(r *segmentReader, off int64) (int64, error) {
	size := r.size
	if off+4 > size {
		return size + 1, nil
	}
	h, err := r.at(off, 4)
	if err != nil {
		return 0, err
	}
	n := int64(binary.LittleEndian.Uint32(h))
	end := off + frameHeaderLen + n
	sectorEnd := (off/sectorSize + 1) * sectorSize
	switch {
	case end > size:
		return off + 1, nil
	case off+4 > sectorEnd:
		return size + 1, nil
	case n == 0:
		sector, err := r.at(off, min(sectorEnd, size)-off)
		if err != nil {
			return 0, err
		}
		if lastNonZeroIn(sector) >= 0 {
			return off + 1, nil
		}
		return size + 1, nil
	}
	return end, nil
}

// wholeBut reports whether the record at off is whole but for its length
// field, and ends at p: its CRC holds for the length p-off-8, and the
// bytes up to p decode as a body of LSN expect. Neither alone is proof
// enough against a payload crafted to look like the end of a record: a
// CRC-32C can be forged by whoever knows the record's bytes, and a
// strict prefix of a body never decodes (the encoding is self-delimiting
// and must be consumed exactly), so together they leave a torn record's
// payload no way in. The CRC is checked a window at a time, so only a
// body it vouches for is read whole.
func wholeBut(r *segmentReader, off, p int64, expect LSN) (bool, error) {
	if p < off+frameHeaderLen+minBodyLen {
		return false, nil
	}
	n := p - off - frameHeaderLen
	var lenField [4]byte
	binary.LittleEndian.PutUint32(lenField[:], uint32(n))
	h, err := r.at(off+4, 4)
	if err != nil {
		return false, err
	}
	want := binary.LittleEndian.Uint32(h)
	c, err := r.crc(crc32.Checksum(lenField[:], castagnoli), off+frameHeaderLen, n)
	if err != nil || c != want {
		return false, err
	}
	body, err := r.at(off+frameHeaderLen, n)
	if err != nil {
		return false, err
	}
	b, err := decodeBody(body)
	return err == nil && b.LSN == expect, nil
}

// ErrCorrupt reports a log that lost or damaged a record that may have
// been acknowledged. Open refuses such a log rather than drop writes.
var ErrCorrupt = errors.New("wal: corrupt log")

// CorruptionError names where a log is corrupt. It unwraps to ErrCorrupt.
type CorruptionError struct {
	Segment string // the segment file's base name
	Offset  int64  // the byte offset of the bad record or header field
	Reason  string
	// err is what it unwraps to: ErrCorrupt, or ErrUnknownVersion.
	err error
}

func (e *CorruptionError) Error() string {
	if e.err == ErrUnknownVersion {
		return fmt.Sprintf("%v: segment %s: %s", ErrUnknownVersion, e.Segment, e.Reason)
	}
	return fmt.Sprintf("wal: corrupt log: segment %s offset %d: %s", e.Segment, e.Offset, e.Reason)
}

// Unwrap returns ErrCorrupt, or ErrUnknownVersion (which wraps it) for a
// segment of an unknown format.
func (e *CorruptionError) Unwrap() error {
	if e.err != nil {
		return e.err
	}
	return ErrCorrupt
}

func corrupt(seg segment, off int64, reason string) error {
	return &CorruptionError{Segment: seg.name, Offset: off, Reason: reason}
}

func join(dir string, seg segment) string { return filepath.Join(dir, seg.name) }
