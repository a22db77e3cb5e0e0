package participant

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// Compacted is what a CompactPass removed.
type Compacted struct {
	// Conversations is how many conversations lost rows.
	Conversations int
	// OplogRows and OutboxRows count the rows trimmed.
	OplogRows, OutboxRows uint64
	// Receipts counts the receipts written for trimmed token rows.
	Receipts int
	// Forgotten counts the token index entries deleted under the token
	// window: tokens of trimmed rows older than it, which get no receipt.
	Forgotten int
	// Released counts the retained records given up unacknowledged under
	// Options.MaxUnackedAge (their rows go in a later pass, after the
	// retention).
	Released uint64
	// Deleted counts the conversations deleted: every participant had
	// left, the retention ago (delete.go).
	Deleted int
}

// trimStep bounds the rows of each stream one hold of a conversation's
// turn trims: in bbolt, one write transaction per stream.
const trimStep = 4096

// receiptBatchBytes bounds the receipts one PutBytes writes.
const receiptBatchBytes = 4 << 20

// CompactPass removes, for every conversation with a checkpoint, the rows
// that nothing can need any more (docs/DESIGN.md, Data lifecycle): oplog and
// outbox rows below the newest compaction mark at least Options.Retain
// old (under a token window, at least the window and the skew: see
// retention), and never the last row a checkpoint covers. It reads at most
// Options.CheckpointPassRows oplog rows in all to settle tokens. For each
// conversation it first, under Options.MaxUnackedAge, commits the release
// of the records older than that (releaseStale: their rows go in a later
// pass); then it settles the tokens of the rows about to go
// (settleTokens) and flushes, raising the token floor first when it
// forgets some; then it trims in steps, each under the conversation's
// turn for a few thousand rows and one flush, about as long as a commit
// holds it: a reconciliation or a token lookup (which run under the turn)
// never sees rows go from under it. Removed rows are gone when it
// returns. A conversation whose checkpoint does not decode is skipped
// (its next load refuses it); a failing store is returned.
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
	convs := s.conversations()
	now := s.now()
	cutoff := now.Add(-s.retention()).UnixMilli()
	if out.Deleted, err = s.deletePass(ctx, cutoff); err != nil {
		return out, false, err
	}
	// The pinned gauge keeps its meaning, --retain, under a window too.
	pinCutoff := now.Add(-s.opts.Retain).UnixMilli()
	// Under the token window, the tokens of the rows a pass trims are
	// forgotten (no receipt) when they are older than forget (see
	// retention), after a floor past the newest of them is persisted. A
	// row whose token is not (a clock that went back, a token from before
	// the window) gets its receipt, as without a window.
	var forget int64
	if w := s.opts.TokenWindow; w > 0 {
		forget = now.Add(-w).UnixMilli()
	}
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
		if age := s.opts.MaxUnackedAge; age > 0 {
			n, err := s.releaseStale(ctx, cv, now.Add(-age).UnixMilli())
			s.passes.released.Add(n)
			out.Released += n
			if err != nil {
				return out, budget == 0, err
			}
		}
		forgets := cv.resets.Load()
		ck, err := loadCheckpoint(s.st, cv.id)
		var ref *refusal
		switch {
		case errors.As(err, &ref), err == nil && ck == nil:
			// Unreadable (its next load refuses it), or none yet.
			continue
		case err != nil && cv.resets.Load() != forgets:
			// Forgotten meanwhile (its ownership lost): its next owner
			// compacts it.
			continue
		case err != nil:
			return out, budget == 0, err
		}
		if s.pinnedBy(cv.id, ck, pinCutoff) {
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
		n, forgettable, opBytes, err := s.settleTokens(ctx, cs, cv.id, opFirst, opFloor, forget)
		s.passes.receipts.Add(uint64(n))
		if err != nil {
			return out, budget == 0, err
		}
		out.Receipts += n
		if len(forgettable.entries) > 0 {
			// The floor goes just past the newest token forgotten, never
			// to forget itself: a clock that ran ahead would otherwise
			// persist a floor in the future, and every fresh token would
			// be token_expired until real time passed it.
			ok, err := s.raiseFloor(ctx, cv, forgettable.newest+1, resets)
			if err != nil {
				return out, budget == 0, err
			}
			if !ok {
				continue
			}
			forgot, err := s.forgetTokens(forgettable.entries)
			s.passes.forgotten.Add(uint64(forgot))
			out.Forgotten += forgot
			if err != nil {
				return out, budget == 0, fmt.Errorf("participant: forget a token of %v: %w", cv.id, err)
			}
		}
		// The receipts (and the checkpoint they rely on) must be durable
		// before the rows they stand in for are trimmed. The deletions
		// of forgotten entries need not precede the trims (an entry
		// naming a trimmed row without a receipt reads as not committed,
		// and the floor refuses its token), but the one flush orders
		// them too.
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
			err = s.trimTurn(cs, cv.id, opAt, opTo, obAt, obTo)
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

// retention is how old a compaction mark must be for the rows below it to
// go: Options.Retain, or under the token window at least the window plus
// the skew and a millisecond. A row below a mark of time m committed by m,
// so its token's time is at most m+TokenSkew (admitToken), and a mark
// older than that makes every token it trims older than now-window: a
// pass forgets them all and writes no receipt. The checkpointer keeps
// marks by the same age.
func (s *Service) retention() time.Duration {
	r := s.opts.Retain
	if w := s.opts.TokenWindow; w > 0 {
		r = max(r, w+s.opts.TokenSkew+time.Millisecond)
	}
	return r
}

// floorMark returns the newest mark at or before cutoff (unix ms).
func floorMark(marks []checkpoint.Mark, cutoff int64) (checkpoint.Mark, bool) {
	var m checkpoint.Mark
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
func (s *Service) pinnedBy(c ConversationID, ck *checkpoint.Checkpoint, cutoff int64) bool {
	if len(ck.Records) == 0 {
		return false
	}
	at, stored, err := s.committedAt(c, ck.Records[0].Oplog)
	return err == nil && stored && at <= cutoff
}

// committedAt returns when oplog row i of c committed (unix ms), read
// from the store; stored is false when the row is not stored (compacted,
// or past the end).
func (s *Service) committedAt(c ConversationID, i uint64) (at int64, stored bool, err error) {
	b, err := readOne(s.st, oplog.Stream(c), i)
	if err != nil || b == nil {
		return 0, false, err
	}
	row, err := oplog.Decode(b)
	if err != nil {
		return 0, false, fmt.Errorf("participant: oplog row %d of %v: %w", i, c, err)
	}
	return row.At, true, nil
}

// raiseFloor raises cv's token floor (windowKey) to to, unless it is
// there already, and flushes it, before any token below it is forgotten.
// It takes cv's turn for the write, as a commit does, so that admitToken
// sees the new floor no later than the store does. It reports false, with nothing forgotten, when cv
// was reset since resets or another writer moved the floor (cluster mode:
// cv is another node's now); a later pass retries.
func (s *Service) raiseFloor(ctx context.Context, cv *conversation, to int64, resets uint64) (bool, error) {
	if err := cv.acquire(ctx); err != nil {
		return false, err
	}
	if cv.resets.Load() != resets {
		s.release(cv)
		return false, nil
	}
	floor, err := s.floorTurn(cv)
	if err == nil && to > floor {
		err = s.st.CAS(tokenindex.FloorKey(cv.id), uint64(floor), uint64(to))
		if err == nil {
			cv.tokenFloor = to
		} else {
			cv.tokenFloorAt = 0
		}
	}
	s.release(cv)
	if errors.Is(err, store.ErrCASConflict) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("participant: raise the token floor of %v: %w", cv.id, err)
	}
	if err := s.flush(cv.id); err != nil {
		return false, fmt.Errorf("participant: raise the token floor of %v: %w", cv.id, err)
	}
	return cv.resets.Load() == resets, nil
}

// forgettable is what settleTokens leaves to forget: the index entries of
// the token-bearing rows it wrote no receipt for, and the newest of their
// tokens' times (unix ms).
type forgettable struct {
	entries []tokenWrite // key, and the value naming the row (tokenindex.Value)
	newest  int64
}

// settleTokens settles the tokens of c's oplog rows in [from, to), about
// to be trimmed: it writes a receipt for every token-bearing row, in
// byte-bounded pages and batches, without flushing; except that a row
// whose token is a UUIDv7 older than forget (unix ms; 0: none) gets no
// receipt, and is returned in forgettable instead, for the caller to
// persist a floor past the newest of them and then delete their entries
// (forgetTokens). It returns how many receipts it wrote and the stored
// bytes of the rows it read.
func (s *Service) settleTokens(ctx context.Context, cs store.Compactor, c ConversationID, from, to uint64, forget int64) (written int, f forgettable, rowBytes int64, err error) {
	if from >= to {
		return 0, f, 0, nil
	}
	held, err := s.pages.budget.acquire(ctx, int64(s.pages.bytes))
	if err != nil {
		return 0, f, 0, fmt.Errorf("participant: waiting to read %v: %w", c, err)
	}
	defer s.pages.budget.release(held)
	ops, err := newPageReader(s.st, oplog.Stream(c), s.pages.bytes, from)
	if err != nil {
		return 0, f, 0, err
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
			return written, f, rowBytes, err
		}
		rowBytes += int64(len(b))
		row, err := oplog.Decode(b)
		if err != nil {
			// Covered by a checkpoint, so it derived once: a row that no
			// longer decodes is damage, and stays for verify to report.
			return written, f, rowBytes, fmt.Errorf("participant: compacting %v: oplog row %d: %w", c, i, err)
		}
		if !row.HasToken() {
			continue
		}
		if ms, v7 := tokenTime(row.Token); v7 && ms < forget {
			f.entries = append(f.entries, tokenWrite{key: tokenindex.RowKey(c, &row), old: tokenindex.Value(i)})
			f.newest = max(f.newest, ms)
			continue
		}
		enc, err := receipt.Encode(receipt.Of(&row))
		if err != nil {
			return written, f, rowBytes, err
		}
		batch = append(batch, store.Bytes{Key: receipt.Key(c, i), Value: enc})
		if size += len(enc); size >= receiptBatchBytes {
			if err := put(); err != nil {
				return written, f, rowBytes, err
			}
		}
	}
	return written, f, rowBytes, put()
}

// forgetTokens deletes the index entries ws, each from the row it names
// to absent, without flushing, and returns how many it deleted. An entry
// that no longer names its row is left: a pass before deleted it already
// (a commit of the same token after the row cannot happen, the row made
// it committed). The caller persisted a floor above every entry's token.
func (s *Service) forgetTokens(ws []tokenWrite) (int, error) {
	forgot := 0
	for _, w := range ws {
		err := s.st.CAS(w.key, w.old, 0)
		switch {
		case err == nil:
			forgot++
		case !errors.Is(err, store.ErrCASConflict):
			return forgot, err
		}
	}
	return forgot, nil
}

// trimTurn trims c's streams from their firsts to the given floors and
// flushes. The caller holds c's turn.
func (s *Service) trimTurn(cs store.Compactor, c ConversationID, opFirst, opFloor, obFirst, obFloor uint64) error {
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
