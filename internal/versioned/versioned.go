// Package versioned encodes the stored rows of participantd's formats: a
// version byte followed by the row's msgpack body, written in one buffer
// sized for the row instead of a growing buffer copied at the end.
package versioned

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Encode returns version followed by v's msgpack encoding, the bytes
// msgpack.Marshal would give after the version byte. sizeHint is the
// expected length of the result: a row whose payload is most of its size
// is then allocated once, at its size, rather than grown by doubling and
// copied.
func Encode(version byte, v any, sizeHint int) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, max(sizeHint, 1)))
	buf.WriteByte(version)
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	err := enc.Encode(v)
	msgpack.PutEncoder(enc)
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
