package participant

import (
	"bytes"

	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/store"
)

// Receipts (package receipt) stand in for the token-bearing oplog rows
// compaction removed; compaction.go writes them, and a token lookup whose
// index entry names a compacted row reads one here.

// readReceipt returns the receipt of conversation c's compacted oplog row
// idx, nil when it has none.
func readReceipt(st store.DurableStore, c ConversationID, idx uint64) (*receipt.Receipt, error) {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return nil, nil
	}
	b, err := cs.GetBytes(receipt.Key(c, idx))
	if err == nil && b == nil {
		// Compacted before receipts had version 2.
		b, err = cs.GetBytes(receipt.KeyV1(c, idx))
	}
	if err != nil || b == nil {
		return nil, err
	}
	return receipt.Decode(b)
}

// samePayload reports whether payload is the one the prior row committed,
// from the row itself or, after compaction, from its receipt's hash.
func (pr *prior) samePayload(payload []byte) bool {
	if pr.payloadHash != nil {
		return bytes.Equal(receipt.Hash(payload), pr.payloadHash)
	}
	return bytes.Equal(pr.row.Payload, payload)
}
