package wire

import (
	"encoding/binary"
	"math"
)

// This file holds the small subset of msgpack this package needs: compact
// appenders, a bounds-checked structural walker for untrusted bytes, and
// readers of single values at offsets the walker has already validated.

// msgpack format bytes.
const (
	mpNil      = 0xc0
	mpNever    = 0xc1
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

// --- appenders: always the most compact encoding ---

func appendMapHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(b, mpMap16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, mpMap32), uint32(n))
}

func appendArrayHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(b, mpArray16, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, mpArray32), uint32(n))
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, mpUint8, byte(v))
	case v <= math.MaxUint16:
		return append(b, mpUint16, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, mpUint32), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, mpUint64), v)
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, mpStr8, byte(n))
	case n <= math.MaxUint16:
		b = append(b, mpStr16, byte(n>>8), byte(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, mpStr32), uint32(n))
	}
	return append(b, s...)
}

func appendBin(b []byte, p []byte) []byte {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		b = append(b, mpBin8, byte(n))
	case n <= math.MaxUint16:
		b = append(b, mpBin16, byte(n>>8), byte(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, mpBin32), uint32(n))
	}
	return append(b, p...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, mpTrue)
	}
	return append(b, mpFalse)
}

// --- the structural walker: the only code that reads untrusted lengths ---

// skipValue walks the msgpack value starting at b[i] and returns the offset
// just past it. It checks every declared length (of a str, bin, ext, array or
// map) against the bytes left before trusting it, so it never allocates and
// never loops more often than there are bytes. It is iterative: it keeps only
// the count of values still owed, so nesting depth costs neither stack nor
// memory and needs no cap. Every value takes at least one byte, so owing more
// values than bytes left is already a lie and is refused at once.
func skipValue(b []byte, i int) (int, *DecodeError) {
	owed := uint64(1)
	for owed > 0 {
		if i >= len(b) {
			return 0, malformed("value at offset %d: body ends", i)
		}
		c := b[i]
		at := i
		i++
		owed--
		var n, items uint64 // payload bytes to skip, child values owed
		switch {
		case c <= 0x7f || c >= 0xe0: // positive or negative fixint
		case c <= 0x8f: // fixmap
			items = 2 * uint64(c&0x0f)
		case c <= 0x9f: // fixarray
			items = uint64(c & 0x0f)
		case c <= 0xbf: // fixstr
			n = uint64(c & 0x1f)
		default:
			var w int // width of the length that follows c
			switch c {
			case mpNil, mpFalse, mpTrue:
			case mpNever:
				return 0, malformed("offset %d: byte 0xc1 is not msgpack", at)
			case mpUint8, mpInt8:
				n = 1
			case mpUint16, mpInt16:
				n = 2
			case mpUint32, mpInt32, mpFloat32:
				n = 4
			case mpUint64, mpInt64, mpFloat64:
				n = 8
			case mpFixExt1:
				n = 2
			case mpFixExt2:
				n = 3
			case mpFixExt4:
				n = 5
			case mpFixExt8:
				n = 9
			case mpFixExt16:
				n = 17
			case mpBin8, mpStr8, mpExt8:
				w = 1
			case mpBin16, mpStr16, mpExt16, mpArray16, mpMap16:
				w = 2
			case mpBin32, mpStr32, mpExt32, mpArray32, mpMap32:
				w = 4
			}
			if w > 0 {
				if len(b)-i < w {
					return 0, malformed("offset %d: length of type 0x%02x truncated", at, c)
				}
				var l uint64
				for _, x := range b[i : i+w] {
					l = l<<8 | uint64(x)
				}
				i += w
				switch c {
				case mpExt8, mpExt16, mpExt32:
					n = l + 1 // the ext type byte
				case mpArray16, mpArray32:
					items = l
				case mpMap16, mpMap32:
					items = 2 * l
				default:
					n = l
				}
			}
		}
		left := uint64(len(b) - i)
		if n > left {
			return 0, malformed("offset %d: declares %d bytes, %d left", at, n, left)
		}
		i += int(n)
		owed += items
		if owed > left-n {
			return 0, malformed("offset %d: declares %d more values than the %d bytes left", at, owed, left-n)
		}
	}
	return i, nil
}

// --- readers of values at validated offsets ---
//
// Each reports ok=false when the value at b[i] is of another type. They may
// rely on skipValue having accepted the value: lengths are in range.

func readUint(b []byte, i int) (uint64, bool) {
	c := b[i]
	switch {
	case c <= 0x7f:
		return uint64(c), true
	case c == mpUint8:
		return uint64(b[i+1]), true
	case c == mpUint16:
		return uint64(binary.BigEndian.Uint16(b[i+1:])), true
	case c == mpUint32:
		return uint64(binary.BigEndian.Uint32(b[i+1:])), true
	case c == mpUint64:
		return binary.BigEndian.Uint64(b[i+1:]), true
	case c == mpInt8:
		v := int8(b[i+1])
		return uint64(v), v >= 0
	case c == mpInt16:
		v := int16(binary.BigEndian.Uint16(b[i+1:]))
		return uint64(v), v >= 0
	case c == mpInt32:
		v := int32(binary.BigEndian.Uint32(b[i+1:]))
		return uint64(v), v >= 0
	case c == mpInt64:
		v := int64(binary.BigEndian.Uint64(b[i+1:]))
		return uint64(v), v >= 0
	}
	return 0, false
}

// readStr returns the bytes of the str at b[i] (aliasing b) and the offset
// past it.
func readStr(b []byte, i int) ([]byte, int, bool) {
	c := b[i]
	var n, h int
	switch {
	case c&0xe0 == 0xa0:
		n, h = int(c&0x1f), 1
	case c == mpStr8:
		n, h = int(b[i+1]), 2
	case c == mpStr16:
		n, h = int(binary.BigEndian.Uint16(b[i+1:])), 3
	case c == mpStr32:
		n, h = int(binary.BigEndian.Uint32(b[i+1:])), 5
	default:
		return nil, 0, false
	}
	s := i + h
	return b[s : s+n : s+n], s + n, true
}

// readBin returns the bytes of the bin at b[i], aliasing b.
func readBin(b []byte, i int) ([]byte, bool) {
	var n, h int
	switch b[i] {
	case mpBin8:
		n, h = int(b[i+1]), 2
	case mpBin16:
		n, h = int(binary.BigEndian.Uint16(b[i+1:])), 3
	case mpBin32:
		n, h = int(binary.BigEndian.Uint32(b[i+1:])), 5
	default:
		return nil, false
	}
	s := i + h
	return b[s : s+n : s+n], true
}

func readBool(b []byte, i int) (v, ok bool) {
	switch b[i] {
	case mpTrue:
		return true, true
	case mpFalse:
		return false, true
	}
	return false, false
}

// readArrayHeader returns the element count of the array at b[i] and the
// offset of its first element.
func readArrayHeader(b []byte, i int) (int, int, bool) {
	c := b[i]
	switch {
	case c&0xf0 == 0x90:
		return int(c & 0x0f), i + 1, true
	case c == mpArray16:
		return int(binary.BigEndian.Uint16(b[i+1:])), i + 3, true
	case c == mpArray32:
		return int(binary.BigEndian.Uint32(b[i+1:])), i + 5, true
	}
	return 0, 0, false
}

// readMapHeader is readArrayHeader for maps; it is used on untrusted bytes
// (the top of a body), so it checks bounds itself.
func readMapHeader(b []byte) (n uint64, next int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	c := b[0]
	switch {
	case c&0xf0 == 0x80:
		return uint64(c & 0x0f), 1, true
	case c == mpMap16 && len(b) >= 3:
		return uint64(binary.BigEndian.Uint16(b[1:])), 3, true
	case c == mpMap32 && len(b) >= 5:
		return uint64(binary.BigEndian.Uint32(b[1:])), 5, true
	}
	return 0, 0, false
}
