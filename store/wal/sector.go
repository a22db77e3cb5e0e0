package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
)

// Segment format 2 cuts every record into fragments that never cross a
// sector boundary, each stamped and checked on its own, so that what a
// torn write leaves of the last record is told apart from a record that
// was written whole and damaged later (see doc.go, "Torn or damaged").
//
//	fragment
//	offset  size  field
//	0       1     kind: 0xa1 whole record, 0xa2 first, 0xa3 middle, 0xa4 last
//	1       2     n, the data's length, little-endian
//	3       4     stamp: the record's LSN, low 32 bits, little-endian
//	7       4     CRC-32C of bytes 0-6, the data and the end byte
//	11      4     CRC-32C of bytes 0-10 (the header's own check)
//	15      n     data: the next n bytes of the record's body
//	15+n    1     end byte 0x5a
const (
	fragHeaderLen = 15
	// fragOverhead is a fragment's bytes besides its data.
	fragOverhead = fragHeaderLen + 1
	// fragMin is the smallest fragment: one byte of data. A record never
	// starts where fewer bytes are left in the sector; it starts at the
	// next sector, the bytes between left zero.
	fragMin = fragOverhead + 1
	// fragEnd ends every fragment. It and every kind have at least two
	// bits set, so no single flipped bit makes either zero.
	fragEnd byte = 0x5a
)

const (
	kindFull   byte = 0xa1
	kindFirst  byte = 0xa2
	kindMiddle byte = 0xa3
	kindLast   byte = 0xa4
)

// fragKind returns the kind of a record's fragment: whether it is the
// record's first, its last, both or neither.
func fragKind(first, last bool) byte {
	switch {
	case first && last:
		return kindFull
	case first:
		return kindFirst
	case last:
		return kindLast
	}
	return kindMiddle
}

// sectorEnd returns the offset of the sector boundary after off.
func sectorEnd(off int64) int64 { return (off/sectorSize + 1) * sectorSize }

// recordStart returns where the first fragment of a record written at
// off goes: off, or the next sector when the rest of off's sector is too
// small for a fragment.
func recordStart(off int64) int64 {
	if se := sectorEnd(off); se-off < fragMin {
		return se
	}
	return off
}

// framedLen returns the bytes a record whose body has n bytes takes when
// written at off, the zeros before its first fragment included.
func framedLen(off int64, n int) int64 {
	pos := recordStart(off)
	for {
		room := sectorEnd(pos) - pos - fragOverhead
		if int64(n) <= room {
			return pos + fragOverhead + int64(n) - off
		}
		n -= int(room)
		pos = sectorEnd(pos)
	}
}

// appendRecord appends to dst the bytes of the record of lsn with body,
// written at segment offset off: zeros up to its first fragment, then its
// fragments, each filling the rest of its sector but the last.
func appendRecord(dst []byte, off int64, lsn LSN, body []byte) []byte {
	pos := recordStart(off)
	dst = append(dst, make([]byte, pos-off)...)
	for first := true; ; first = false {
		room := int(sectorEnd(pos) - pos - fragOverhead)
		n := min(room, len(body))
		last := n == len(body)
		h := len(dst)
		dst = append(dst, fragKind(first, last))
		dst = binary.LittleEndian.AppendUint16(dst, uint16(n))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(lsn))
		dst = append(dst, make([]byte, 8)...)
		dst = append(dst, body[:n]...)
		dst = append(dst, fragEnd)
		c := crc32.Update(crc32.Checksum(dst[h:h+7], castagnoli), castagnoli, dst[h+fragHeaderLen:])
		binary.LittleEndian.PutUint32(dst[h+7:], c)
		binary.LittleEndian.PutUint32(dst[h+11:], crc32.Checksum(dst[h:h+11], castagnoli))
		body = body[n:]
		if last {
			return dst
		}
		pos = sectorEnd(pos)
	}
}

// frameInPlace turns buf, which holds a record's body, into the record
// appendRecord writes at off for that body, in buf's own array (grown
// once to the record's length when it is too small): the body is moved
// to the end of the record's bytes and cut into fragments from the
// front. No fragment overtakes the body still to be cut: what is left to
// write is always at least the body left plus 16 bytes a fragment, so
// each header is written before the bytes it shifts data over, and copy
// moves overlapping bytes correctly. Append uses it so that a record
// costs one buffer, not a body's and a record's.
func frameInPlace(buf []byte, off int64, lsn LSN) []byte {
	n := len(buf)
	total := int(framedLen(off, n))
	buf = slices.Grow(buf, total-n)[:total]
	in := total - n
	copy(buf[in:], buf[:n])
	pos := recordStart(off)
	out := int(pos - off)
	clear(buf[:out])
	for first := true; ; first = false {
		room := int(sectorEnd(pos) - pos - fragOverhead)
		k := min(room, total-in)
		last := in+k == total
		h := buf[out : out+fragHeaderLen]
		copy(buf[out+fragHeaderLen:], buf[in:in+k])
		h[0] = fragKind(first, last)
		binary.LittleEndian.PutUint16(h[1:], uint16(k))
		binary.LittleEndian.PutUint32(h[3:], uint32(lsn))
		buf[out+fragHeaderLen+k] = fragEnd
		c := crc32.Update(crc32.Checksum(h[:7], castagnoli), castagnoli, buf[out+fragHeaderLen:out+fragHeaderLen+k+1])
		binary.LittleEndian.PutUint32(h[7:], c)
		binary.LittleEndian.PutUint32(h[11:], crc32.Checksum(h[:11], castagnoli))
		in += k
		out += fragOverhead + k
		if last {
			return buf[:out]
		}
		pos = sectorEnd(pos)
	}
}

// fragHeaderOK reports whether h, a fragment header, passes its own CRC.
func fragHeaderOK(h []byte) bool {
	return binary.LittleEndian.Uint32(h[11:]) == crc32.Checksum(h[:11], castagnoli)
}

// fragHeader checks the header h of the fragment at pos, the k-th of the
// record of LSN lsn, in a segment of size bytes: its own CRC, a kind that
// fits k, the record's stamp, and a length that ends it inside its sector
// (at the sector's end unless it is the record's last). It returns the
// data's length and whether the fragment is the record's last.
func fragHeader(h []byte, pos, size int64, k int, lsn LSN) (n int64, last, ok bool) {
	if !fragHeaderOK(h) {
		return 0, false, false
	}
	switch kind := h[0]; {
	case k == 0 && (kind == kindFull || kind == kindFirst):
	case k > 0 && (kind == kindMiddle || kind == kindLast):
	default:
		return 0, false, false
	}
	last = h[0] == kindFull || h[0] == kindLast
	n = int64(binary.LittleEndian.Uint16(h[1:]))
	end := pos + fragOverhead + n
	se := sectorEnd(pos)
	if binary.LittleEndian.Uint32(h[3:]) != uint32(lsn) || n == 0 || end > min(se, size) || (!last && end != se) {
		return 0, false, false
	}
	return n, last, true
}

// fragData checks the fragment f (header, data and end byte, of data
// length n) against its CRC.
func fragData(f []byte, n int64) bool {
	c := crc32.Update(crc32.Checksum(f[:7], castagnoli), castagnoli, f[fragHeaderLen:fragOverhead+n])
	return binary.LittleEndian.Uint32(f[7:]) == c && f[fragHeaderLen+n] == fragEnd
}

// span2 is what fragments2 found of a format-2 record.
type span2 struct {
	// end is the offset just past the record.
	end int64
	// size is its body's length.
	size int
	// head holds the first headLen bytes of its body, up to its version
	// and LSN.
	head    [minBodyLen]byte
	headLen int
	// held is set when the reader's window holds the whole record, the
	// very bytes checked.
	held bool
}

// fragments2 checks the record of LSN lsn at off in a format-2 segment
// where the reader's window holds it, each part once: the zeros before
// its first fragment, then each fragment's header (fragHeader) and data
// (fragData), both on one read of the fragment. ok is false when the
// bytes there are anything else (the caller judges them: see
// checkTail). With lazy set, once a read moved the window past the
// record's start, the fragments left have only their headers checked,
// for the record's extent: the caller reads the record again whole and
// checks it there.
func (r *segmentReader) fragments2(off int64, lsn LSN, lazy bool) (sp span2, ok bool, err error) {
	pos := recordStart(off)
	if pos+fragMin > r.size {
		return sp, false, nil
	}
	if pos > off {
		pad, err := r.at(off, pos-off)
		if err != nil || !allZero(pad) {
			return sp, false, err
		}
	}
	for k := 0; ; k++ {
		if pos+fragMin > r.size {
			return sp, false, nil
		}
		// The header's length says how much to read; the fragment is
		// then checked on that one read, its header included.
		h, err := r.at(pos, fragHeaderLen)
		if err != nil {
			return sp, false, err
		}
		n := int64(binary.LittleEndian.Uint16(h[1:]))
		if pos+fragOverhead+n > min(sectorEnd(pos), r.size) {
			return sp, false, nil
		}
		f, err := r.at(pos, fragOverhead+n)
		if err != nil {
			return sp, false, err
		}
		m, last, ok := fragHeader(f, pos, r.size, k, lsn)
		if !ok || m != n {
			return sp, false, nil
		}
		if !lazy || r.winOff <= off {
			if !fragData(f, n) {
				return sp, false, nil
			}
			sp.headLen += copy(sp.head[sp.headLen:], f[fragHeaderLen:fragHeaderLen+n])
		}
		sp.size += int(n)
		if last {
			sp.end = pos + fragOverhead + n
			break
		}
		pos = sectorEnd(pos)
	}
	// Every read is inside [off, end), and one that moved the window
	// started it past off: the window holds what was checked when it
	// still starts at or before off.
	sp.held = r.winOff <= off
	return sp, true, nil
}

// record2 returns the body of the whole, valid record of LSN lsn at off
// in a format-2 segment, in a buffer of its own, and the offset just past
// it; ok is false when the bytes there are anything else (the caller
// judges them: see checkTail). The record's bytes are the reader's window
// (or a buffer of their own, for a record larger than it) when it
// returns, for keep: a record the window did not hold whole as it was
// checked (one a window, where the window ends, and each larger than the
// window) is read again whole and checked there.
func (r *segmentReader) record2(off int64, lsn LSN) (body []byte, end int64, ok bool, err error) {
	sp, ok, err := r.fragments2(off, lsn, true)
	if err != nil || !ok {
		return nil, 0, false, err
	}
	if !sp.held {
		if _, err := r.at(off, sp.end-off); err != nil {
			return nil, 0, false, err
		}
		// Read whole, the record is in the window unless its bytes
		// changed between the two reads: then it is judged as bad.
		if sp, ok, err = r.fragments2(off, lsn, false); err != nil || !ok || !sp.held {
			return nil, 0, false, err
		}
	}
	body = make([]byte, 0, sp.size)
	for pos := recordStart(off); pos < sp.end; pos = sectorEnd(pos) {
		f := r.win[pos-r.winOff:]
		n := binary.LittleEndian.Uint16(f[1:])
		body = append(body, f[fragHeaderLen:fragHeaderLen+int(n)]...)
	}
	return body, sp.end, true, nil
}

func allZero(b []byte) bool { return lastNonZeroIn(b) < 0 }

// checkTail judges the bytes of a format-2 segment from off, where the
// valid records end, to last, the last byte that is not zero: nil when
// they are what a torn write of the record of LSN lsn leaves, a
// *CorruptionError otherwise.
//
// The record was written at off over zeros (the rest of a sector the
// record before it filled in part, or preallocated space), in one write
// never synced. A torn write keeps a prefix of it, or any subset of its
// sectors whole. So each of its fragments, in the places the format puts
// them, is one of:
//
//	lost      zeros to the end of its sector
//	kept      valid: its header's CRC, kind, stamp and length, its
//	          data's CRC and end byte
//	cut       a prefix of it, zeros after: nothing but zeros follows
//	          its header, or its header is valid and its end byte zero,
//	          with nothing else after it; and no fragment before it lost
//
// and nothing but zeros follows the last fragment. Anything else was
// never left by a torn write: a record written whole and damaged after
// (one flipped bit leaves its fragment neither lost, since its kind and
// end byte stay non-zero, nor cut, since its end byte does and, when its
// header's length or stamp flipped, the header's CRC fails with bytes
// after it), or damage to the zeros around it.
func checkTail(seg segment, r *segmentReader, off, last int64, lsn LSN) error {
	bad := func(at int64, reason string) error {
		return corrupt(seg, off, fmt.Sprintf("bad bytes at offset %d after the last valid record, not what a torn write of record %v leaves: %s", at, lsn, reason))
	}
	pos := recordStart(off)
	if pos > off {
		pad, err := r.at(off, min(pos, r.size)-off)
		if err != nil {
			return err
		}
		if !allZero(pad) {
			return bad(off, "the bytes before its first fragment are not zero")
		}
	}
	lost := false
	for k := 0; pos <= last; k++ {
		se := min(sectorEnd(pos), r.size)
		sector, err := r.at(pos, se-pos)
		if err != nil {
			return err
		}
		if allZero(sector) {
			lost = true
			pos = sectorEnd(pos)
			continue
		}
		if pos+fragMin > se {
			return bad(pos, "no fragment fits the end of the segment")
		}
		n, isLast, ok := fragHeader(sector, pos, r.size, k, lsn)
		if !ok {
			if !lost && !fragHeaderOK(sector) && last < pos+fragHeaderLen {
				return nil // cut inside the header
			}
			return bad(pos, "a fragment header that fails its check")
		}
		f := sector[:fragOverhead+n]
		endAt := pos + fragHeaderLen + n
		if !fragData(f, n) {
			if !lost && f[fragHeaderLen+n] == 0 && last < endAt {
				return nil // cut inside the data
			}
			return bad(pos, "a fragment whose data fails its check")
		}
		if isLast {
			if last > endAt {
				return bad(last, "bytes after the record's last fragment")
			}
			return nil
		}
		pos = sectorEnd(pos)
	}
	return nil
}

// scanSectors is scanSegment's walk of the records of a format-2
// segment, whose header sc has checked: the valid records one after
// another, then the bytes after them judged by checkTail. A record apply
// is not given is checked where it lies, and only its body's version and
// LSN are read.
func scanSectors(seg segment, r *segmentReader, sc segmentScan, expect, after LSN, apply func(*Batch) error) (segmentScan, error) {
	var head [minBodyLen]byte
	sc, expect, last, err := walkRecords(seg, r, sc, expect, after, apply, func(off int64, expect LSN) ([]byte, int64, bool, bool, error) {
		if expect > after {
			body, end, ok, err := r.record2(off, expect)
			return body, end, true, ok, err
		}
		sp, ok, err := r.fragments2(off, expect, false)
		if err != nil || !ok {
			return nil, 0, false, false, err
		}
		return head[:copy(head[:], sp.head[:sp.headLen])], sp.end, false, true, nil
	})
	if err != nil || !sc.torn {
		return sc, err
	}
	return sc, checkTail(seg, r, sc.end, last, expect)
}
