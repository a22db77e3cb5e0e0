package wal

import (
	"encoding/binary"
	"fmt"
)

// appendFrame appends b's record framed as segment format 1 writes it:
// the body's length and CRC, then the body. No code but tests writes
// format 1 any more; the reader keeps reading it.
func appendFrame(dst []byte, b *Batch) ([]byte, error) {
	start := len(dst)
	dst = append(dst, make([]byte, frameHeaderLen)...)
	dst, err := appendBody(dst, b)
	if err != nil {
		return dst[:start], err
	}
	n := len(dst) - start - frameHeaderLen
	if uint64(n) > MaxRecordLen {
		return dst[:start], fmt.Errorf("%d bytes: %w", n, ErrTooLarge)
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(n))
	binary.LittleEndian.PutUint32(dst[start+4:], frameCRC(dst[start:start+4], dst[start+frameHeaderLen:]))
	return dst, nil
}
