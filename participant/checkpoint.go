package participant

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// Checkpoints (package checkpoint) are written by the checkpointer
// (checkpointer.go) and read here by a start: loaded, checked against the
// streams they lie beside, and filled in with their records' payloads.

// Classes of unloadable conversations found in their checkpoint.
const (
	// ClassCheckpointCorrupt: the checkpoint does not decode or is not
	// well formed.
	ClassCheckpointCorrupt = "checkpoint_corrupt"
	// ClassCheckpointMismatch: the checkpoint does not belong to the
	// streams it lies beside (a digest differs, a row it names is absent).
	ClassCheckpointMismatch = "checkpoint_mismatch"
	// ClassCheckpointMissing: the oplog was compacted but no checkpoint
	// says where the conversation stood.
	ClassCheckpointMissing = "checkpoint_missing"
)

// loadCheckpoint reads and decodes conversation c's checkpoint: nil when
// st keeps none (or cannot, not being a store.Compactor). A checkpoint
// that does not decode is a *refusal.
func loadCheckpoint(st store.DurableStore, c ConversationID) (*checkpoint.Checkpoint, error) {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return nil, nil
	}
	b, err := cs.GetBytes(checkpoint.Key(c))
	if err != nil {
		return nil, fmt.Errorf("participant: read the checkpoint of %v: %w", c, err)
	}
	if b == nil {
		return nil, nil
	}
	ck, err := checkpoint.Decode(b)
	if err != nil {
		return nil, &refusal{ClassCheckpointCorrupt, err.Error()}
	}
	return ck, nil
}

// streamFirst returns the first stored seq of stream, 0 when st does not
// compact.
func streamFirst(st store.DurableStore, stream string) (uint64, error) {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return 0, nil
	}
	first, err := cs.First(stream)
	if err != nil {
		return 0, fmt.Errorf("participant: first of %s: %w", stream, err)
	}
	return first, nil
}

// readOne returns the payload of entry seq of stream, nil when it is not
// stored (past the end, or compacted).
func readOne(st store.DurableStore, stream string, seq uint64) ([]byte, error) {
	entries, err := store.ReadPage(st, stream, seq, 1, 0)
	if errors.Is(err, store.ErrCompacted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("participant: read %s: %w", stream, err)
	}
	if len(entries) != 1 || entries[0].Seq != seq {
		return nil, nil
	}
	return entries[0].Payload, nil
}

// verifyCheckpoint checks that ck lies inside c's stored streams: the rows
// it covers exist, and the last of each is the row it was derived from.
func verifyCheckpoint(st store.DurableStore, ck *checkpoint.Checkpoint, c ConversationID, oplogLen, outboxLen uint64) error {
	mismatch := func(format string, args ...any) error {
		return &refusal{ClassCheckpointMismatch, fmt.Sprintf(format, args...)}
	}
	if ck.Conversation != c {
		return mismatch("checkpoint of conversation %v stored for %v", ck.Conversation, c)
	}
	if ck.Index > oplogLen || ck.Produced > outboxLen {
		return mismatch("checkpoint covers %d oplog and %d outbox rows, the streams have %d and %d",
			ck.Index, ck.Produced, oplogLen, outboxLen)
	}
	last, err := readOne(st, oplog.Stream(c), ck.Index-1)
	if err != nil {
		return err
	}
	if last == nil || sha256.Sum256(last) != ck.OplogDigest {
		return mismatch("oplog row %d is not the row the checkpoint was derived from", ck.Index-1)
	}
	if ck.Produced == 0 {
		return nil
	}
	last, err = readOne(st, outbox.Stream(c), ck.Produced-1)
	if err != nil {
		return err
	}
	if last == nil || sha256.Sum256(last) != ck.OutboxDigest {
		return mismatch("outbox row %d is not the row the checkpoint was derived from", ck.Produced-1)
	}
	return nil
}

// loadRetained fills in the unreclaimed records of state, ck's State,
// without their payloads, and tells at (when not nil) the outbox row that
// produced each, in seq order: from ck's Records (Versions 1 to 3), or
// from the outbox rows its Window names (Version4), read in pages of at
// most pageBytes, records of one subject and recipients sharing one list.
// Rows that do not carry exactly the records the checkpoint names are a
// *refusal. Retained without payloads, the records are cold
// (outbox.Retention): a run of them produced by consecutive oplog rows is
// one span, whatever its length.
func loadRetained(st store.DurableStore, ck *checkpoint.Checkpoint, c ConversationID, pageBytes int, state *outbox.State, at func(Seq, uint64)) error {
	w := ck.Window
	if w == nil {
		for _, r := range ck.Records {
			if at != nil {
				at(r.Record.Seq, r.Outbox)
			}
		}
		return nil
	}
	mismatch := func(format string, args ...any) error {
		return &refusal{ClassCheckpointMismatch, fmt.Sprintf(format, args...)}
	}
	if w.First > ck.LastSeq {
		return nil
	}
	// outbox.Decode keeps nothing of the bytes it decodes.
	rows, err := newBufferedPageReader(st, outbox.Stream(c), pageBytes, w.Outbox)
	if err != nil {
		return err
	}
	if rows.end < ck.Produced {
		return mismatch("the checkpoint's records are in outbox rows %d to %d, the outbox has %d", w.Outbox, ck.Produced-1, rows.end)
	}
	rows.end = ck.Produced
	next := w.First
	for i := w.Outbox; rows.more(); i++ {
		b, err := rows.entry()
		if err != nil {
			return err
		}
		row, err := outbox.Decode(b)
		if err != nil {
			return &refusal{ClassOutboxCorrupt, fmt.Sprintf("outbox row %d: %v", i, err)}
		}
		if i == w.Outbox && (row.Kind != outbox.Produced || row.Source != w.Oplog) {
			return mismatch("outbox row %d is not the row oplog row %d produced record %v in", i, w.Oplog, w.First)
		}
		for _, rec := range row.Records {
			if rec.Seq < next && i == w.Outbox {
				continue
			}
			if rec.Seq != next || row.Source >= ck.Index {
				return mismatch("outbox row %d carries record %v from oplog row %d, the checkpoint's next record is %v", i, rec.Seq, row.Source, next)
			}
			state.Retain(rec, row.Source)
			if at != nil {
				at(rec.Seq, i)
			}
			next++
		}
		if i == w.Outbox && next == w.First {
			return mismatch("outbox row %d does not carry record %v", i, w.First)
		}
	}
	if next != ck.LastSeq+1 {
		return mismatch("the outbox rows of the checkpoint's records end at record %v, its last seq is %v", next-1, ck.LastSeq)
	}
	return nil
}

// loadPayloads fills in the payloads of the `record`s of state from the
// oplog rows that produced them, checking that each row is the tell that
// produced its record. Past window bytes (when not 0) it evicts the
// oldest as it goes, so that it never holds more than the window and one
// payload, whatever the recipients have not read.
func loadPayloads(st store.DurableStore, c ConversationID, state *outbox.State, window int64) error {
	for i, r := range state.Records.All() {
		if r.Kind != outbox.KindRecord {
			continue
		}
		b, err := readOne(st, oplog.Stream(c), r.Source)
		if err != nil {
			return err
		}
		if b == nil {
			return &refusal{ClassCheckpointMismatch, fmt.Sprintf("oplog row %d, the payload of record %v, is not stored", r.Source, r.Seq)}
		}
		row, err := oplog.Decode(b)
		if err != nil {
			return &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", r.Source, err)}
		}
		if row.Kind != oplog.KindTell || row.Seq != r.Seq || row.Participant != r.Participant {
			return &refusal{ClassCheckpointMismatch, fmt.Sprintf("oplog row %d is not the tell of record %v", r.Source, r.Seq)}
		}
		state.Records.HoldPayload(i, row.Payload)
		state.PayloadBytes += int64(len(row.Payload))
		if window > 0 && state.PayloadBytes > window {
			state.Evict(state.PayloadBytes - window)
		}
	}
	return nil
}

// rederive checks conversation c's stored checkpoint against a replay from
// row 0, while row 0 is still stored: the thorough check that the offline
// verify runs. A start trusts a checkpoint that decodes (CRC, canonical
// form), is well formed and matches the digests of the last rows it
// covers; only a replay can tell a state that was derived wrongly.
// Compaction marks are left out of the comparison: they depend on the
// clock of the pass that wrote them. A difference is a *refusal.
func rederive(ctx context.Context, st store.DurableStore, c ConversationID, p pages) error {
	ck, err := loadCheckpoint(st, c)
	if err != nil || ck == nil {
		return err
	}
	if first, err := streamFirst(st, oplog.Stream(c)); err != nil || first > 0 {
		return err
	}
	want, rb, err := derive(ctx, st, c, p, nil, ck.Index, time.Now(), DefaultRetain)
	if err != nil {
		return err
	}
	if ck.Window == nil {
		// Written by an older version, with its records inline: compare
		// them too.
		want.Window, want.Records = nil, rb.inline()
	}
	got := *ck
	got.Marks, want.Marks = nil, nil
	a, err := checkpoint.Encode(&got)
	if err != nil {
		return err
	}
	b, err := checkpoint.Encode(want)
	if err != nil {
		return err
	}
	if !bytes.Equal(a, b) {
		return &refusal{ClassCheckpointMismatch, fmt.Sprintf("the checkpoint at oplog row %d is not what its rows derive", ck.Index)}
	}
	return nil
}
