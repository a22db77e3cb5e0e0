package participant

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// A receipt stands in for a token-bearing oplog row once compaction
// removed it: exactly what a replay of the row's token answers or checks,
// about 60 bytes, kept forever (docs/DESIGN.md, Replays after compaction):
//
//	value receipt/<conversation>/<oplog index, 20 digits>
//	  = receiptVersion | msgpack array {kind, participant, generation,
//	    token, seq, cursor, commit time, SHA-256 of a tell's payload
//	    truncated to 16 bytes (empty for other kinds)}
//
// Receipts are keyed by the row's index, as the token index names rows: a
// lookup whose index entry names a compacted row reads the receipt there
// and verifies it as it would verify the row. Compaction makes the receipts
// of every token-bearing row durable before it trims the rows, so a
// compacted row without a receipt carried no token. The fixed-width index
// keeps a conversation's receipts in insertion order, so the store packs
// them densely.

const receiptVersion byte = 1

// receiptHashLen is how much of a tell payload's SHA-256 a receipt keeps:
// 128 bits, so that two payloads that collide cost 2^64 work, and only the
// client that chose both could be fooled (it would get a replay instead of
// token_conflict for its own retry).
const receiptHashLen = 16

// ReceiptPrefix starts the key of every receipt.
const ReceiptPrefix = "receipt/"

func receiptKey(c ConversationID, idx uint64) string {
	return fmt.Sprintf("%s%s/%020d", ReceiptPrefix, c, idx)
}

type receipt struct {
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

// encodeReceiptBody returns the stored form of r.
func encodeReceiptBody(r *receipt) ([]byte, error) {
	body, err := msgpack.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("participant: encode receipt: %w", err)
	}
	return append([]byte{receiptVersion}, body...), nil
}

func decodeReceipt(b []byte) (*receipt, error) {
	if len(b) < 2 || b[0] != receiptVersion {
		return nil, fmt.Errorf("%w: %d bytes, version %v", errReceiptCorrupt, len(b), b[:min(len(b), 1)])
	}
	r := &receipt{}
	if err := msgpack.Unmarshal(b[1:], r); err != nil {
		return nil, fmt.Errorf("%w: %v", errReceiptCorrupt, err)
	}
	if again, err := msgpack.Marshal(r); err != nil || !bytes.Equal(again, b[1:]) {
		return nil, fmt.Errorf("%w: not in canonical form", errReceiptCorrupt)
	}
	if (r.Kind == oplog.KindTell) != (len(r.PayloadHash) == receiptHashLen) || (r.Kind != oplog.KindTell && r.PayloadHash != nil) {
		return nil, fmt.Errorf("%w: payload hash of %d bytes for a %v", errReceiptCorrupt, len(r.PayloadHash), r.Kind)
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
