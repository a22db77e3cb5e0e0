package receipt

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
)

// Versions of a receipt, its first byte.
const (
	Version1 byte = 1
	Version2 byte = 2
)

// HashLen is how much of a tell payload's SHA-256 a receipt keeps: 128
// bits, so that two payloads that collide cost 2^64 work, and only the
// client that chose both could be fooled (it would get a replay instead
// of token_conflict for its own retry).
const HashLen = 16

// KeyPrefix starts the key of every receipt.
const KeyPrefix = "receipt/"

// Key is the key of the receipt of conversation c's oplog row idx.
func Key(c oplog.ConversationID, idx uint64) string {
	k := make([]byte, 0, len(KeyPrefix)+20+1+8)
	k = append(k, KeyPrefix...)
	k = strconv.AppendUint(k, uint64(c), 10)
	k = append(k, '/')
	return string(binary.BigEndian.AppendUint64(k, idx))
}

// KeyV1 is where version 1 kept it.
func KeyV1(c oplog.ConversationID, idx uint64) string {
	return fmt.Sprintf("%s%s/%020d", KeyPrefix, c, idx)
}

// Receipt is what a receipt keeps of its oplog row.
type Receipt struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Kind        oplog.Kind
	Participant oplog.ParticipantID
	Generation  oplog.Generation
	Token       oplog.Token
	Seq         oplog.Seq
	Cursor      oplog.Seq
	At          int64
	// PayloadHash is Hash of a tell's payload; nil for other kinds.
	PayloadHash []byte
}

// ErrCorrupt: the bytes are not a receipt of a known version, in its one
// encoding.
var ErrCorrupt = errors.New("receipt: corrupt")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Hash returns what a receipt keeps of a tell's payload, in a new slice.
func Hash(payload []byte) []byte {
	h := sha256.Sum256(payload)
	return h[:HashLen]
}

// Of returns the receipt of row, a token-bearing oplog row.
func Of(row *oplog.Row) *Receipt {
	r := &Receipt{Kind: row.Kind, Participant: row.Participant, Generation: row.Generation, Token: row.Token,
		Seq: row.Seq, Cursor: row.Cursor, At: row.At}
	if row.Kind == oplog.KindTell {
		r.PayloadHash = Hash(row.Payload)
	}
	return r
}

// Row returns the parts of the oplog row r kept.
func (r *Receipt) Row() oplog.Row {
	return oplog.Row{Kind: r.Kind, Participant: r.Participant, Generation: r.Generation, Token: r.Token,
		Seq: r.Seq, Cursor: r.Cursor, At: r.At}
}

// hashFits reports whether r's payload hash is what its kind carries.
func (r *Receipt) hashFits() bool {
	if r.Kind == oplog.KindTell {
		return len(r.PayloadHash) == HashLen
	}
	return r.PayloadHash == nil
}

// Encode returns r in the stored form of Version2, in a new slice. It
// fails when r's payload hash does not fit its kind.
func Encode(r *Receipt) ([]byte, error) {
	if !r.hashFits() {
		return nil, fmt.Errorf("receipt: encode: payload hash of %d bytes for a %v", len(r.PayloadHash), r.Kind)
	}
	b := make([]byte, 0, 2+len(r.Token)+5*binary.MaxVarintLen64+len(r.PayloadHash)+4)
	b = append(b, Version2, byte(r.Kind))
	b = append(b, r.Token[:]...)
	b = binary.AppendUvarint(b, uint64(r.Participant))
	b = binary.AppendUvarint(b, uint64(r.Generation))
	b = binary.AppendUvarint(b, uint64(r.Seq))
	b = binary.AppendUvarint(b, uint64(r.Cursor))
	b = binary.AppendVarint(b, r.At)
	b = append(b, r.PayloadHash...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable)), nil
}

// EncodeV1 returns r in the stored form of Version1, which nothing writes
// any more: for tests and tools that build the files of older builds.
func EncodeV1(r *Receipt) ([]byte, error) {
	body, err := msgpack.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("receipt: encode: %w", err)
	}
	return append([]byte{Version1}, body...), nil
}

// Decode parses a stored receipt of either version. Errors wrap
// ErrCorrupt; the receipt shares no memory with b.
func Decode(b []byte) (*Receipt, error) {
	if len(b) < 2 || (b[0] != Version2 && b[0] != Version1) {
		return nil, fmt.Errorf("%w: %d bytes, version %v", ErrCorrupt, len(b), b[:min(len(b), 1)])
	}
	var r *Receipt
	var err error
	if b[0] == Version1 {
		r, err = decodeV1(b[1:])
	} else {
		r, err = decodeV2(b)
	}
	if err != nil {
		return nil, err
	}
	if !r.hashFits() {
		return nil, fmt.Errorf("%w: payload hash of %d bytes for a %v", ErrCorrupt, len(r.PayloadHash), r.Kind)
	}
	return r, nil
}

// decodeV1 decodes the msgpack body of a version 1 receipt, accepting only
// the body EncodeV1 writes.
func decodeV1(body []byte) (*Receipt, error) {
	r := &Receipt{}
	if err := msgpack.Unmarshal(body, r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if again, err := msgpack.Marshal(r); err != nil || !bytes.Equal(again, body) {
		return nil, fmt.Errorf("%w: not in canonical form", ErrCorrupt)
	}
	return r, nil
}

// decodeV2 decodes b, version byte included, accepting only exactly what
// Encode writes.
func decodeV2(b []byte) (*Receipt, error) {
	const fixed = 2 + len(oplog.Token{})
	if len(b) < fixed+5+4 {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, crcTable), binary.BigEndian.Uint32(b[len(b)-4:]); got != want {
		return nil, fmt.Errorf("%w: CRC %08x, stored %08x", ErrCorrupt, got, want)
	}
	r := &Receipt{Kind: oplog.Kind(body[1])}
	copy(r.Token[:], body[2:fixed])
	rest := body[fixed:]
	var nums [4]uint64
	for i := range nums {
		v, n := binary.Uvarint(rest)
		if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
			return nil, fmt.Errorf("%w: field %d is not a minimal uvarint", ErrCorrupt, i)
		}
		nums[i], rest = v, rest[n:]
	}
	r.Participant, r.Generation = oplog.ParticipantID(nums[0]), oplog.Generation(nums[1])
	r.Seq, r.Cursor = oplog.Seq(nums[2]), oplog.Seq(nums[3])
	at, n := binary.Varint(rest)
	if n <= 0 || n != len(binary.AppendVarint(nil, at)) {
		return nil, fmt.Errorf("%w: commit time is not a minimal varint", ErrCorrupt)
	}
	r.At, rest = at, rest[n:]
	switch {
	case len(rest) == HashLen && r.Kind == oplog.KindTell:
		r.PayloadHash = append([]byte(nil), rest...)
	case len(rest) != 0 || r.Kind == oplog.KindTell:
		return nil, fmt.Errorf("%w: %d bytes after the commit time of a %v", ErrCorrupt, len(rest), r.Kind)
	}
	return r, nil
}
