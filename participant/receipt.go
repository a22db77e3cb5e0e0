package participant

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// A receipt stands in for a token-bearing oplog row once compaction
// removed it: what a replay of the row's token answers or checks, tens of
// bytes, kept forever (DESIGN.md, Replays after compaction):
//
//	value receipt/<conversation>/<oplog index>
//	  = receiptVersion | msgpack array {Row without its payload, SHA-256 of the payload}
//
// Receipts are keyed by the row's index, as the token index names rows: a
// lookup whose index entry names a compacted row reads the receipt there
// and verifies it as it would verify the row. Compaction makes the receipts
// of every token-bearing row durable before it trims the rows, so a
// compacted row without a receipt carried no token.

const receiptVersion byte = 1

// ReceiptPrefix starts the key of every receipt.
const ReceiptPrefix = "receipt/"

func receiptKey(c ConversationID, idx uint64) string {
	return ReceiptPrefix + c.String() + "/" + strconv.FormatUint(idx, 10)
}

type receipt struct {
	_msgpack struct{} `msgpack:",as_array"`

	Row         oplog.Row
	PayloadHash [32]byte
}

var errReceiptCorrupt = errors.New("participant: receipt corrupt")

func encodeReceipt(row *oplog.Row) ([]byte, error) {
	r := receipt{Row: *row, PayloadHash: sha256.Sum256(row.Payload)}
	r.Row.Payload = nil
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
	if again, err := msgpack.Marshal(r); err != nil || !bytes.Equal(again, b[1:]) || r.Row.Payload != nil {
		return nil, fmt.Errorf("%w: not in canonical form", errReceiptCorrupt)
	}
	return r, nil
}

// readReceipt returns the receipt of conversation c's compacted oplog row
// idx, nil when it has none.
func readReceipt(st store.DurableStore, c ConversationID, idx uint64) (*receipt, error) {
	cs, ok := st.(store.Compactor)
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
		return sha256.Sum256(payload) == *pr.payloadHash
	}
	return bytes.Equal(pr.row.Payload, payload)
}
