package participant

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// Compacted is what a CompactPass removed.
type Compacted struct {
	// Conversations is how many conversations lost rows.
	Conversations int
	// OplogRows and OutboxRows count the rows trimmed.
	OplogRows, OutboxRows uint64
	// Receipts counts the receipts written for trimmed token rows.
	Receipts int
}

// trimStep bounds the rows of each stream one hold of a conversation's
// turn trims: in bbolt, one write transaction per stream.
const trimStep = 4096

// receiptBatchBytes bounds the receipts one PutBytes writes.
const receiptBatchBytes = 4 << 20

// CompactPass removes, for every conversation with a checkpoint, the rows
// that nothing can need any more (docs/DESIGN.md, Data lifecycle): oplog and
// outbox rows below the newest compaction mark at least Options.Retain
// old, and never the last row a checkpoint covers. It reads at most
// Options.CheckpointPassRows oplog rows in all. For each conversation it
// writes the receipts of the token-bearing rows about to go and flushes,
// then trims in steps, each under the conversation's turn for a few
// thousand rows and one flush, about as long as a commit holds it: a reconciliation or a token lookup (which run
// under the turn) never sees rows go from under it. Removed rows are gone
// when it returns. A conversation whose checkpoint does not decode is
// skipped (its next load refuses it); a failing store is returned.
func (s *Service) CompactPass(ctx context.Context) (Compacted, error) {
	out, _, err := s.compactPass(ctx)
	return out, err
}

// compactPass is CompactPass; full reports that it stopped because its row
// budget ran out, with rows possibly still to remove.
func (s *Service) compactPass(ctx context.Context) (out Compacted, full bool, err error) {
	cs, ok := store.AsCompactor(s.st)
	if !ok {
		return out, false, nil
	}
	defer s.passEnded(ctx, PassCompaction, time.Now(), &err)
	s.mu.Lock()
	convs := make([]*conversation, 0, len(s.convs))
	for _, cv := range s.convs {
		convs = append(convs, cv)
	}
	s.mu.Unlock()
	cutoff := s.now().Add(-s.opts.Retain).UnixMilli()
	budget := uint64(s.opts.CheckpointPassRows)
	pinned, visitedAll := 0, true
	defer func() {
		if err == nil && visitedAll {
			s.passes.pinned.Store(int64(pinned) + 1)
		}
	}()
	for _, cv := range convs {
		if budget == 0 || ctx.Err() != nil {
			visitedAll = false
			break
		}
		if cv.contained() || cv.loaded() == nil {
			// Refused, or not loaded: not served here now (in cluster
			// mode, perhaps owned by another node); a later pass
			// compacts it once it is loaded again.
			continue
		}
		ck, err := loadCheckpoint(s.st, cv.id)
		var ref *refusal
		if errors.As(err, &ref) || ck == nil {
			continue
		}
		if err != nil {
			return out, budget == 0, err
		}
		if s.pinnedBy(cv.id, ck, cutoff) {
			pinned++
		}
		m, ok := floorMark(ck.Marks, cutoff)
		if !ok {
			continue
		}
		// The last row of each stream a checkpoint covers stays: its
		// digest is how a start knows the checkpoint belongs there.
		opFloor := min(m.Oplog, ck.Index-1)
		var obFloor uint64
		if ck.Produced > 0 {
			obFloor = min(m.Outbox, ck.Produced-1)
		}
		opFirst, err := streamFirst(s.st, oplog.Stream(cv.id))
		if err != nil {
			return out, budget == 0, err
		}
		obFirst, err := streamFirst(s.st, outbox.Stream(cv.id))
		if err != nil {
			return out, budget == 0, err
		}
		opFloor = min(opFloor, opFirst+budget)
		if opFloor <= opFirst && obFloor <= obFirst {
			continue
		}
		// A reset of the conversation after this point (its ownership
		// lost and regained, its scope in the store reset) may have
		// discarded receipts staged below; the trims check it under the
		// turn, so that no row goes whose receipt is not durable.
		resets := cv.resets.Load()
		n, opBytes, err := s.writeReceipts(ctx, cs, cv.id, opFirst, opFloor)
		s.passes.receipts.Add(uint64(n))
		if err != nil {
			return out, budget == 0, err
		}
		out.Receipts += n
		// The receipts (and the checkpoint they rely on) must be durable
		// before the rows they stand in for are trimmed.
		if err := s.flush(cv.id); err != nil {
			return out, budget == 0, fmt.Errorf("participant: write receipts of %v: %w", cv.id, err)
		}
		// The turn is taken per step of at most trimStep rows of each
		// stream, so it is never held much longer than a commit holds it.
		reset := false
		for opAt, obAt := opFirst, obFirst; opAt < opFloor || obAt < obFloor; {
			opTo, obTo := min(opFloor, opAt+trimStep), min(obFloor, obAt+trimStep)
			if err := cv.acquire(ctx); err != nil {
				return out, budget == 0, err
			}
			if cv.resets.Load() != resets {
				// Reset since the receipts were written: a later pass
				// writes them again, after the reconciliation.
				s.release(cv)
				reset = true
				break
			}
			err = s.trimLocked(cs, cv.id, opAt, opTo, obAt, obTo)
			s.release(cv)
			if err != nil {
				return out, budget == 0, err
			}
			opAt, obAt = max(opAt, opTo), max(obAt, obTo)
		}
		if reset {
			continue
		}
		out.Conversations++
		if opFloor > opFirst {
			out.OplogRows += opFloor - opFirst
			budget -= opFloor - opFirst
			s.passes.opRows.Add(opFloor - opFirst)
			s.passes.opBytes.Add(uint64(opBytes))
		}
		if obFloor > obFirst {
			out.OutboxRows += obFloor - obFirst
			s.passes.obRows.Add(obFloor - obFirst)
		}
	}
	return out, budget == 0, nil
}

// floorMark returns the newest mark at or before cutoff (unix ms).
func floorMark(marks []mark, cutoff int64) (mark, bool) {
	var m mark
	ok := false
	for _, x := range marks {
		if x.At > cutoff {
			break
		}
		m, ok = x, true
	}
	return m, ok
}

// pinnedBy reports whether conversation c, checkpointed as ck, holds a
// record that some recipient has not acknowledged although the row that
// produced it committed before cutoff (unix ms): the member that has not
// acknowledged it pins c's history from that row on. It reads that one
// row; a row it cannot read counts as not pinned, since this feeds a gauge
// only and the trims that follow report a failing store.
func (s *Service) pinnedBy(c ConversationID, ck *checkpoint, cutoff int64) bool {
	if len(ck.Records) == 0 {
		return false
	}
	b, err := readOne(s.st, oplog.Stream(c), ck.Records[0].Oplog)
	if err != nil || b == nil {
		return false
	}
	row, err := oplog.Decode(b)
	return err == nil && row.At <= cutoff
}

// writeReceipts writes a receipt for every token-bearing row of c's oplog
// in [from, to), in byte-bounded pages and batches, without flushing. It
// returns how many it wrote and the stored bytes of the rows it read.
func (s *Service) writeReceipts(ctx context.Context, cs store.Compactor, c ConversationID, from, to uint64) (written int, rowBytes int64, err error) {
	if from >= to {
		return 0, 0, nil
	}
	held, err := s.pages.budget.acquire(ctx, int64(s.pages.bytes))
	if err != nil {
		return 0, 0, fmt.Errorf("participant: waiting to read %v: %w", c, err)
	}
	defer s.pages.budget.release(held)
	ops, err := newPageReader(s.st, oplog.Stream(c), s.pages.bytes, from)
	if err != nil {
		return 0, 0, err
	}
	ops.end = min(ops.end, to)
	var batch []store.Bytes
	size := 0
	put := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := cs.PutBytes(batch); err != nil {
			return fmt.Errorf("participant: write receipts of %v: %w", c, err)
		}
		written += len(batch)
		batch, size = batch[:0], 0
		return nil
	}
	for i := from; ops.more(); i++ {
		b, err := ops.entry()
		if err != nil {
			return written, rowBytes, err
		}
		rowBytes += int64(len(b))
		row, err := oplog.Decode(b)
		if err != nil {
			// Covered by a checkpoint, so it derived once: a row that no
			// longer decodes is damage, and stays for verify to report.
			return written, rowBytes, fmt.Errorf("participant: compacting %v: oplog row %d: %w", c, i, err)
		}
		if !row.Kind.HasToken() {
			continue
		}
		enc, err := encodeReceipt(&row)
		if err != nil {
			return written, rowBytes, err
		}
		batch = append(batch, store.Bytes{Key: receiptKey(c, i), Value: enc})
		if size += len(enc); size >= receiptBatchBytes {
			if err := put(); err != nil {
				return written, rowBytes, err
			}
		}
	}
	return written, rowBytes, put()
}

// trimLocked trims c's streams from their firsts to the given floors and
// flushes. The caller holds c's turn.
func (s *Service) trimLocked(cs store.Compactor, c ConversationID, opFirst, opFloor, obFirst, obFloor uint64) error {
	if opFloor > opFirst {
		if err := cs.Trim(oplog.Stream(c), opFloor); err != nil {
			return fmt.Errorf("participant: compact %v: %w", c, err)
		}
	}
	if obFloor > obFirst {
		if err := cs.Trim(outbox.Stream(c), obFloor); err != nil {
			return fmt.Errorf("participant: compact %v: %w", c, err)
		}
	}
	if err := s.flush(c); err != nil {
		return fmt.Errorf("participant: compact %v: %w", c, err)
	}
	return nil
}
