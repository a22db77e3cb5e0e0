package participant

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
	"github.com/participantd/participantd/store"
)

// A receipt stands in for a token-bearing oplog row once compaction
// removed it: exactly what a replay of the row's token answers or checks,
// kept forever (docs/DESIGN.md, Replays after compaction). Compaction
// writes version 2; version 1, written before, is still read:
//
//	value receipt/<conversation>/<oplog index, 8 bytes big-endian>   (v2)
//	  = 2 | kind (1 byte) | token (16 bytes) | uvarint participant |
//	    uvarint generation | uvarint seq | uvarint cursor |
//	    varint commit time (unix ms) | a tell's payload SHA-256
//	    truncated to 16 bytes (absent for other kinds) |
//	    CRC-32C (Castagnoli) of everything before it, 4 bytes big-endian
//	  about 50 bytes for a tell
//	value receipt/<conversation>/<oplog index, 20 decimal digits>    (v1)
//	  = 1 | msgpack array {kind, participant, generation, token, seq,
//	    cursor, commit time, payload hash (empty for other kinds)}
//
// Receipts are keyed by the row's index, as the token index names rows: a
// lookup whose index entry names a compacted row reads the receipt there
// (the v2 key, then the v1 key) and verifies it as it would verify the
// row. Compaction makes the receipts of every token-bearing row durable
// before it trims the rows, so a compacted row without a receipt carried
// no token. The fixed-width index keeps a conversation's receipts in
// insertion order, so the store packs them densely. A receipt must decode
// exactly (known version, every varint minimal, nothing left over, the
// CRC matching): one that does not is answered unavailable, never "not
// committed", since a damaged token would otherwise let its retry commit
// twice.

const (
	receiptVersion1 byte = 1
	receiptVersion  byte = 2
)

// receiptHashLen is how much of a tell payload's SHA-256 a receipt keeps:
// 128 bits, so that two payloads that collide cost 2^64 work, and only the
// client that chose both could be fooled (it would get a replay instead of
// token_conflict for its own retry).
const receiptHashLen = 16

// ReceiptPrefix starts the key of every receipt.
const ReceiptPrefix = "receipt/"

// receiptKey is the key compaction writes the receipt of conversation c's
// oplog row idx under.
func receiptKey(c ConversationID, idx uint64) string {
	k := make([]byte, 0, len(ReceiptPrefix)+20+1+8)
	k = append(k, ReceiptPrefix...)
	k = strconv.AppendUint(k, uint64(c), 10)
	k = append(k, '/')
	return string(binary.BigEndian.AppendUint64(k, idx))
}

// receiptKeyV1 is where version 1 kept it.
func receiptKeyV1(c ConversationID, idx uint64) string {
	return fmt.Sprintf("%s%s/%020d", ReceiptPrefix, c, idx)
}

type receipt struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Kind        oplog.Kind
	Participant ParticipantID
	Generation  Generation
	Token       Token
	Seq         Seq
	Cursor      Seq
	At          int64
	PayloadHash []byte
}

var errReceiptCorrupt = errors.New("participant: receipt corrupt")

func payloadHash(payload []byte) []byte {
	h := sha256.Sum256(payload)
	return h[:receiptHashLen]
}

func encodeReceipt(row *oplog.Row) ([]byte, error) {
	r := receipt{Kind: row.Kind, Participant: row.Participant, Generation: row.Generation, Token: row.Token,
		Seq: row.Seq, Cursor: row.Cursor, At: row.At}
	if row.Kind == oplog.KindTell {
		r.PayloadHash = payloadHash(row.Payload)
	}
	return encodeReceiptBody(&r)
}

// encodeReceiptBody returns the stored form of r (version 2).
func encodeReceiptBody(r *receipt) ([]byte, error) {
	if (r.Kind == oplog.KindTell) != (len(r.PayloadHash) == receiptHashLen) || (r.Kind != oplog.KindTell && r.PayloadHash != nil) {
		return nil, fmt.Errorf("participant: encode receipt: payload hash of %d bytes for a %v", len(r.PayloadHash), r.Kind)
	}
	b := make([]byte, 0, 2+len(r.Token)+5*binary.MaxVarintLen64+len(r.PayloadHash)+4)
	b = append(b, receiptVersion, byte(r.Kind))
	b = append(b, r.Token[:]...)
	b = binary.AppendUvarint(b, uint64(r.Participant))
	b = binary.AppendUvarint(b, uint64(r.Generation))
	b = binary.AppendUvarint(b, uint64(r.Seq))
	b = binary.AppendUvarint(b, uint64(r.Cursor))
	b = binary.AppendVarint(b, r.At)
	b = append(b, r.PayloadHash...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable)), nil
}

// encodeReceiptV1 returns r in the stored form of version 1, for the tests
// of files written before version 2.
func encodeReceiptV1(r *receipt) ([]byte, error) {
	body, err := msgpack.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("participant: encode receipt: %w", err)
	}
	return append([]byte{receiptVersion1}, body...), nil
}

func decodeReceipt(b []byte) (*receipt, error) {
	if len(b) < 2 || (b[0] != receiptVersion && b[0] != receiptVersion1) {
		return nil, fmt.Errorf("%w: %d bytes, version %v", errReceiptCorrupt, len(b), b[:min(len(b), 1)])
	}
	var r *receipt
	var err error
	if b[0] == receiptVersion1 {
		r, err = decodeReceiptV1(b[1:])
	} else {
		r, err = decodeReceiptV2(b)
	}
	if err != nil {
		return nil, err
	}
	if (r.Kind == oplog.KindTell) != (len(r.PayloadHash) == receiptHashLen) || (r.Kind != oplog.KindTell && r.PayloadHash != nil) {
		return nil, fmt.Errorf("%w: payload hash of %d bytes for a %v", errReceiptCorrupt, len(r.PayloadHash), r.Kind)
	}
	return r, nil
}

func decodeReceiptV1(body []byte) (*receipt, error) {
	r := &receipt{}
	if err := msgpack.Unmarshal(body, r); err != nil {
		return nil, fmt.Errorf("%w: %v", errReceiptCorrupt, err)
	}
	if again, err := msgpack.Marshal(r); err != nil || !bytes.Equal(again, body) {
		return nil, fmt.Errorf("%w: not in canonical form", errReceiptCorrupt)
	}
	return r, nil
}

// decodeReceiptV2 decodes b, version byte included, and accepts only
// exactly what encodeReceiptBody writes.
func decodeReceiptV2(b []byte) (*receipt, error) {
	const fixed = 2 + len(Token{})
	if len(b) < fixed+5+4 {
		return nil, fmt.Errorf("%w: %d bytes", errReceiptCorrupt, len(b))
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, crcTable), binary.BigEndian.Uint32(b[len(b)-4:]); got != want {
		return nil, fmt.Errorf("%w: CRC %08x, stored %08x", errReceiptCorrupt, got, want)
	}
	r := &receipt{Kind: oplog.Kind(body[1])}
	copy(r.Token[:], body[2:fixed])
	rest := body[fixed:]
	var nums [4]uint64
	for i := range nums {
		v, n := binary.Uvarint(rest)
		if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
			return nil, fmt.Errorf("%w: field %d is not a minimal uvarint", errReceiptCorrupt, i)
		}
		nums[i], rest = v, rest[n:]
	}
	r.Participant, r.Generation, r.Seq, r.Cursor = ParticipantID(nums[0]), Generation(nums[1]), Seq(nums[2]), Seq(nums[3])
	at, n := binary.Varint(rest)
	if n <= 0 || n != len(binary.AppendVarint(nil, at)) {
		return nil, fmt.Errorf("%w: commit time is not a minimal varint", errReceiptCorrupt)
	}
	r.At, rest = at, rest[n:]
	switch {
	case len(rest) == receiptHashLen && r.Kind == oplog.KindTell:
		r.PayloadHash = append([]byte(nil), rest...)
	case len(rest) != 0 || r.Kind == oplog.KindTell:
		return nil, fmt.Errorf("%w: %d bytes after the commit time of a %v", errReceiptCorrupt, len(rest), r.Kind)
	}
	return r, nil
}

// row returns the parts of the oplog row the receipt kept.
func (r *receipt) row() oplog.Row {
	return oplog.Row{Kind: r.Kind, Participant: r.Participant, Generation: r.Generation, Token: r.Token,
		Seq: r.Seq, Cursor: r.Cursor, At: r.At}
}

// readReceipt returns the receipt of conversation c's compacted oplog row
// idx, nil when it has none.
func readReceipt(st store.DurableStore, c ConversationID, idx uint64) (*receipt, error) {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return nil, nil
	}
	b, err := cs.GetBytes(receiptKey(c, idx))
	if err == nil && b == nil {
		// Compacted before receipts had version 2.
		b, err = cs.GetBytes(receiptKeyV1(c, idx))
	}
	if err != nil || b == nil {
		return nil, err
	}
	return decodeReceipt(b)
}

// samePayload reports whether payload is the one the prior row committed,
// from the row itself or, after compaction, from its receipt's hash.
func (pr *prior) samePayload(payload []byte) bool {
	if pr.payloadHash != nil {
		return bytes.Equal(payloadHash(payload), pr.payloadHash)
	}
	return bytes.Equal(pr.row.Payload, payload)
}
