package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
)

// LSN is a record's log sequence number: 1 for the first record ever
// written, and one more for each record after it.
type LSN uint64

func (l LSN) String() string { return strconv.FormatUint(uint64(l), 10) }

// StreamAppend is the entries a batch appends to one stream: Payloads[i]
// gets seq First+i.
type StreamAppend struct {
	Stream   string
	First    uint64
	Payloads [][]byte
}

// ValueWrite is one value a batch sets; 0 deletes it.
type ValueWrite struct {
	Key   string
	Value uint64
}

// StreamTrim drops the entries of Stream with seq < Below.
type StreamTrim struct {
	Stream string
	Below  uint64
}

// BytesWrite is one byte value a batch sets; an empty Value deletes it.
type BytesWrite struct {
	Key   string
	Value []byte
}

// Batch is one group commit: the content of one record. Its parts apply
// in order: Appends, Values, Trims, then Bytes (a trim only ever covers
// entries of earlier records, so applying it after the appends is the
// order they were made in).
type Batch struct {
	LSN     LSN
	Appends []StreamAppend
	Values  []ValueWrite
	Trims   []StreamTrim
	Bytes   []BytesWrite
}

// Record body versions; see doc.go. A batch without trims or byte values
// is written as version 1, so a log without them stays readable by a
// reader of version 1 only.
const (
	recordVersion1 = 1
	recordVersion2 = 2
)

const (
	// frameHeaderLen is the length and the CRC before each body in a
	// segment of format 1.
	frameHeaderLen = 8
	// minBodyLen is the version byte and the LSN.
	minBodyLen = 1 + 8
	// MaxRecordLen bounds a record body, so that its length fits a
	// format-1 frame.
	MaxRecordLen = math.MaxUint32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrTooLarge reports a batch whose record would exceed MaxRecordLen.
var ErrTooLarge = errors.New("wal: batch too large for one record")

// appendBody appends the body of b's record to dst.
func appendBody(dst []byte, b *Batch) ([]byte, error) {
	start := len(dst)
	version := byte(recordVersion1)
	if len(b.Trims) > 0 || len(b.Bytes) > 0 {
		version = recordVersion2
	}
	dst = append(dst, version)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.LSN))
	dst = binary.AppendUvarint(dst, uint64(len(b.Appends)))
	for _, a := range b.Appends {
		dst = binary.AppendUvarint(dst, uint64(len(a.Stream)))
		dst = append(dst, a.Stream...)
		dst = binary.AppendUvarint(dst, a.First)
		dst = binary.AppendUvarint(dst, uint64(len(a.Payloads)))
		for _, p := range a.Payloads {
			dst = binary.AppendUvarint(dst, uint64(len(p)))
			dst = append(dst, p...)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Values)))
	for _, v := range b.Values {
		dst = binary.AppendUvarint(dst, uint64(len(v.Key)))
		dst = append(dst, v.Key...)
		dst = binary.LittleEndian.AppendUint64(dst, v.Value)
	}
	if version >= recordVersion2 {
		dst = binary.AppendUvarint(dst, uint64(len(b.Trims)))
		for _, t := range b.Trims {
			dst = binary.AppendUvarint(dst, uint64(len(t.Stream)))
			dst = append(dst, t.Stream...)
			dst = binary.AppendUvarint(dst, t.Below)
		}
		dst = binary.AppendUvarint(dst, uint64(len(b.Bytes)))
		for _, v := range b.Bytes {
			dst = binary.AppendUvarint(dst, uint64(len(v.Key)))
			dst = append(dst, v.Key...)
			dst = binary.AppendUvarint(dst, uint64(len(v.Value)))
			dst = append(dst, v.Value...)
		}
	}
	// uint64: MaxRecordLen overflows a 32-bit int, where no slice reaches it.
	if n := len(dst) - start; uint64(n) > MaxRecordLen {
		return dst[:start], fmt.Errorf("%d bytes: %w", n, ErrTooLarge)
	}
	return dst, nil
}

// frameCRC is the CRC-32C of a format-1 frame's length field and body: a
// torn or flipped length then fails the check as surely as a bad body.
func frameCRC(lenField, body []byte) uint32 {
	return crc32.Update(crc32.Checksum(lenField, castagnoli), castagnoli, body)
}

// errNoFrame reports that buf holds no valid frame at the offset read.
var errNoFrame = errors.New("no valid record")

// readFrame returns the body of the valid format-1 frame at buf[off:]
// and the offset just past it. A zero length, a frame running past buf, or a CRC
// mismatch is errNoFrame.
func readFrame(buf []byte, off int64) (body []byte, end int64, err error) {
	if off+frameHeaderLen > int64(len(buf)) {
		return nil, 0, errNoFrame
	}
	n := int64(binary.LittleEndian.Uint32(buf[off:]))
	if n < minBodyLen || off+frameHeaderLen+n > int64(len(buf)) {
		return nil, 0, errNoFrame
	}
	body = buf[off+frameHeaderLen : off+frameHeaderLen+n]
	if binary.LittleEndian.Uint32(buf[off+4:]) != frameCRC(buf[off:off+4], body) {
		return nil, 0, errNoFrame
	}
	return body, off + frameHeaderLen + n, nil
}

// peekLSN returns the LSN of a body of a known version, without
// checking the CRC.
func peekLSN(buf []byte, off int64) (LSN, bool) {
	if off+frameHeaderLen+minBodyLen > int64(len(buf)) {
		return 0, false
	}
	if v := buf[off+frameHeaderLen]; v != recordVersion1 && v != recordVersion2 {
		return 0, false
	}
	return LSN(binary.LittleEndian.Uint64(buf[off+frameHeaderLen+1:])), true
}

// errVersion reports a record body of an unknown version.
func errVersion(v byte) error {
	return fmt.Errorf("record version %d, want %d or %d", v, recordVersion1, recordVersion2)
}

// bodyLSN returns the LSN of a record body from its first bytes, having
// checked its version: all a scan reads of a record it walks past.
func bodyLSN(head []byte) (LSN, error) {
	if len(head) > 0 && head[0] != recordVersion1 && head[0] != recordVersion2 {
		return 0, errVersion(head[0])
	}
	if len(head) < minBodyLen {
		return 0, errShort
	}
	return LSN(binary.LittleEndian.Uint64(head[1:])), nil
}

// decodeBody decodes a record body. The returned batch's names are copies;
// its payloads alias body.
func decodeBody(body []byte) (*Batch, error) {
	d := decoder{buf: body}
	version := d.byte()
	if version != recordVersion1 && version != recordVersion2 {
		return nil, errVersion(version)
	}
	b := &Batch{LSN: LSN(d.u64())}
	n := d.count()
	if d.err == nil {
		b.Appends = make([]StreamAppend, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		a := StreamAppend{Stream: string(d.bytes()), First: d.uvarint()}
		m := d.count()
		if d.err == nil {
			a.Payloads = make([][]byte, 0, m)
		}
		for j := uint64(0); j < m && d.err == nil; j++ {
			a.Payloads = append(a.Payloads, d.bytes())
		}
		b.Appends = append(b.Appends, a)
	}
	n = d.count()
	if d.err == nil {
		b.Values = make([]ValueWrite, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		b.Values = append(b.Values, ValueWrite{Key: string(d.bytes()), Value: d.u64()})
	}
	if version >= recordVersion2 {
		n = d.count()
		if d.err == nil && n > 0 {
			b.Trims = make([]StreamTrim, 0, n)
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			b.Trims = append(b.Trims, StreamTrim{Stream: string(d.bytes()), Below: d.uvarint()})
		}
		n = d.count()
		if d.err == nil && n > 0 {
			b.Bytes = make([]BytesWrite, 0, n)
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			b.Bytes = append(b.Bytes, BytesWrite{Key: string(d.bytes()), Value: d.bytes()})
		}
	}
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%d bytes after the record", len(d.buf))
	}
	if d.err != nil {
		return nil, d.err
	}
	return b, nil
}

// decoder reads a body; its first error sticks and later reads return
// zeros.
type decoder struct {
	buf []byte
	err error
}

var errShort = errors.New("record body ends early")

func (d *decoder) byte() byte {
	if d.err != nil || len(d.buf) < 1 {
		d.fail()
		return 0
	}
	v := d.buf[0]
	d.buf = d.buf[1:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil || len(d.buf) < 8 {
		d.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

// count reads a count of items of at least one byte each, so that a bad
// count cannot make the decoder allocate more than the body's size.
func (d *decoder) count() uint64 {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.buf)) {
		d.err = fmt.Errorf("count %d exceeds the %d bytes left", n, len(d.buf))
		return 0
	}
	return n
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.buf)) {
		d.fail()
		return nil
	}
	v := d.buf[:n:n]
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errShort
	}
}
