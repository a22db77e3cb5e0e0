package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// checkBounds walks the msgpack value in b without decoding it and refuses
// one that declares more items or bytes than b holds. The msgpack library
// allocates a slice of structs for the length an array header declares
// before reading a single element (v5.4.1 ignores its own allocation
// limit there), so a damaged row declaring 2^32-1 records would take the
// process down with an out-of-memory crash instead of being refused as
// corrupt. Every item takes at least one byte, so a value that passes asks
// for no more elements than b has bytes. Trailing bytes are left to the
// decoder.
func checkBounds(b []byte) error {
	need := uint64(1) // items still to read
	for need > 0 {
		if uint64(len(b)) < need {
			return fmt.Errorf("%d items declared, %d bytes left", need, len(b))
		}
		need--
		t := b[0]
		b = b[1:]
		var skip, items uint64
		switch {
		case t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3: // fixint, nil, bool
		case t >= 0x80 && t <= 0x8f: // fixmap
			items = 2 * uint64(t&0x0f)
		case t >= 0x90 && t <= 0x9f: // fixarray
			items = uint64(t & 0x0f)
		case t >= 0xa0 && t <= 0xbf: // fixstr
			skip = uint64(t & 0x1f)
		default:
			var err error
			if skip, items, b, err = header(t, b); err != nil {
				return err
			}
		}
		if skip > uint64(len(b)) {
			return fmt.Errorf("%d bytes declared, %d left", skip, len(b))
		}
		b = b[skip:]
		need += items
	}
	return nil
}

// header reads the length that follows type byte t (beyond the fixed
// forms) and returns the bytes to skip and the items to read after it.
func header(t byte, b []byte) (skip, items uint64, rest []byte, err error) {
	n := func(size int) (uint64, error) {
		if len(b) < size {
			return 0, errors.New("truncated length")
		}
		var v uint64
		switch size {
		case 1:
			v = uint64(b[0])
		case 2:
			v = uint64(binary.BigEndian.Uint16(b))
		case 4:
			v = uint64(binary.BigEndian.Uint32(b))
		}
		b = b[size:]
		return v, nil
	}
	var v uint64
	switch t {
	case 0xcc, 0xd0: // uint8, int8
		skip = 1
	case 0xcd, 0xd1:
		skip = 2
	case 0xce, 0xd2, 0xca: // 32-bit ints, float32
		skip = 4
	case 0xcf, 0xd3, 0xcb: // 64-bit ints, float64
		skip = 8
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16, plus the type byte
		skip = 1 + 1<<(t-0xd4)
	case 0xc4, 0xd9: // bin8, str8
		v, err = n(1)
		skip = v
	case 0xc5, 0xda:
		v, err = n(2)
		skip = v
	case 0xc6, 0xdb:
		v, err = n(4)
		skip = v
	case 0xc7, 0xc8, 0xc9: // ext 8, 16, 32, plus the type byte
		v, err = n(1 << (t - 0xc7))
		skip = v + 1
	case 0xdc:
		items, err = n(2)
	case 0xdd:
		items, err = n(4)
	case 0xde:
		v, err = n(2)
		items = 2 * v
	case 0xdf:
		v, err = n(4)
		items = 2 * v
	default: // 0xc1, never used
		return 0, 0, nil, fmt.Errorf("type byte %#x", t)
	}
	return skip, items, b, err
}
