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
// (its next load refuses it). A conversation whose deletion or compaction
// fails otherwise fails alone (passretry.go): the pass goes on with the
// others and returns a *PassFailures. A failed or closed store ends the
// pass and is returned.
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
	p := s.newCompaction(cs)
	var fails passFailures
	if out.Deleted, err = s.deletePass(ctx, p.cutoff, p.now, &fails); err != nil {
		return out, false, err
	}
	convs := s.conversations()
	visitedAll := true
	defer func() {
		if err == nil && visitedAll {
			s.passes.pinned.Store(int64(p.pinned) + 1)
		}
	}()
	for _, cv := range convs {
		if p.budget == 0 || ctx.Err() != nil {
			visitedAll = false
			break
		}
		if cv.contained() || cv.loaded() == nil {
			// Refused, or not loaded: not served here now (in cluster
			// mode, perhaps owned by another node); a later pass
			// compacts it once it is loaded again.
			continue
		}
		if !stepDue(cv, StepCompaction, p.now) {
			continue
		}
		if err := s.compactConversation(ctx, &p, cv, &out); err != nil {
			if s.stepFailed(ctx, &fails, cv, StepCompaction, p.now, err) {
				return out, p.budget == 0, err
			}
			continue
		}
		stepDone(cv, StepCompaction)
	}
	return out, p.budget == 0, fails.result()
}

// compaction is one compaction pass: its horizons, fixed when it starts,
// and what is left of its row budget.
type compaction struct {
	cs store.Compactor
	// now is when the pass started.
	now time.Time
	// cutoff (unix ms): rows go below the newest compaction mark at or
	// before it (retention).
	cutoff int64
	// pinCutoff (unix ms) is --retain ago: the pinned gauge keeps that
	// meaning under a token window too.
	pinCutoff int64
	// forget (unix ms; 0: no token window): the tokens of trimmed rows
	// older than it are forgotten (no receipt), after a floor past the
	// newest of them is persisted. A row whose token is not (a clock that
	// went back, a token from before the window) gets its receipt, as
	// without a window.
	forget int64
	// budget is how many more oplog rows the pass may read
	// (Options.CheckpointPassRows in all).
	budget uint64
	// pinned counts the conversations pinnedBy an unacknowledged record.
	pinned int
}

// newCompaction starts a compaction pass over cs now.
func (s *Service) newCompaction(cs store.Compactor) compaction {
	now := s.now()
	p := compaction{
		cs:        cs,
		now:       now,
		cutoff:    now.Add(-s.retention()).UnixMilli(),
		pinCutoff: now.Add(-s.opts.Retain).UnixMilli(),
		budget:    uint64(s.opts.CheckpointPassRows),
	}
	if w := s.opts.TokenWindow; w > 0 {
		p.forget = now.Add(-w).UnixMilli()
	}
	return p
}

// compactConversation is pass p's work on cv: it releases cv's stale
// records (Options.MaxUnackedAge), then settles and trims the rows below
// its newest compaction mark old enough, within p's budget, and adds what
// it did to out. A conversation without a readable checkpoint, with
// nothing to trim, or reset meanwhile is left to a later pass; the error
// is the step's failure (stepFailed).
func (s *Service) compactConversation(ctx context.Context, p *compaction, cv *conversation, out *Compacted) error {
	if age := s.opts.MaxUnackedAge; age > 0 {
		n, err := s.releaseStale(ctx, cv, p.now.Add(-age).UnixMilli())
		s.passes.released.Add(n)
		out.Released += n
		if err != nil {
			return err
		}
	}
	forgets := cv.resets.Load()
	ck, err := loadCheckpoint(s.st, cv.id)
	var ref *refusal
	switch {
	case errors.As(err, &ref), err == nil && ck == nil:
		// Unreadable (its next load refuses it), or none yet.
		return nil
	case err != nil && cv.resets.Load() != forgets:
		// Forgotten meanwhile (its ownership lost): its next owner
		// compacts it.
		return nil
	case err != nil:
		return err
	}
	if s.pinnedBy(cv.id, ck, p.pinCutoff) {
		p.pinned++
	}
	sp, ok, err := p.span(s.st, cv.id, ck)
	if err != nil || !ok {
		return err
	}
	// A reset of the conversation after this point (its ownership
	// lost and regained, its scope in the store reset) may have
	// discarded receipts staged below; the trims check it under the
	// turn, so that no row goes whose receipt is not durable.
	resets := cv.resets.Load()
	opBytes, ok, err := s.settleSpan(ctx, p, cv, sp, resets, out)
	if err != nil || !ok {
		return err
	}
	ok, err = s.trimInSteps(ctx, p.cs, cv, sp, resets)
	if err != nil || !ok {
		return err
	}
	out.Conversations++
	if sp.opFloor > sp.opFirst {
		out.OplogRows += sp.opFloor - sp.opFirst
		p.budget -= sp.opFloor - sp.opFirst
		s.passes.opRows.Add(sp.opFloor - sp.opFirst)
		s.passes.opBytes.Add(uint64(opBytes))
	}
	if sp.obFloor > sp.obFirst {
		out.OutboxRows += sp.obFloor - sp.obFirst
		s.passes.obRows.Add(sp.obFloor - sp.obFirst)
	}
	return nil
}

// trimSpan is what a pass trims of one conversation: each stream from its
// first stored row up to (not including) its floor.
type trimSpan struct {
	opFirst, opFloor uint64
	obFirst, obFloor uint64
}

// span returns the rows of c, checkpointed as ck, that pass p trims:
// those below the newest mark at or before p.cutoff, at most p.budget
// oplog rows. ok is false when there are none.
func (p *compaction) span(st store.DurableStore, c ConversationID, ck *checkpoint.Checkpoint) (sp trimSpan, ok bool, err error) {
	m, ok := floorMark(ck.Marks, p.cutoff)
	if !ok {
		return sp, false, nil
	}
	// The last row of each stream a checkpoint covers stays: its
	// digest is how a start knows the checkpoint belongs there.
	sp.opFloor = min(m.Oplog, ck.Index-1)
	if ck.Produced > 0 {
		sp.obFloor = min(m.Outbox, ck.Produced-1)
	}
	if sp.opFirst, err = streamFirst(st, oplog.Stream(c)); err != nil {
		return sp, false, err
	}
	if sp.obFirst, err = streamFirst(st, outbox.Stream(c)); err != nil {
		return sp, false, err
	}
	sp.opFloor = min(sp.opFloor, sp.opFirst+p.budget)
	return sp, sp.opFloor > sp.opFirst || sp.obFloor > sp.obFirst, nil
}

// settleSpan makes the oplog rows of sp safe to trim: it writes a receipt
// for each token-bearing row (settleTokens), forgets instead the tokens
// older than p.forget once cv's floor is raised past them, and flushes. It
// returns the stored bytes of the rows it read; ok is false, with nothing
// forgotten, when cv was reset since resets or its floor moved meanwhile
// (raiseFloor): a later pass retries.
func (s *Service) settleSpan(ctx context.Context, p *compaction, cv *conversation, sp trimSpan, resets uint64, out *Compacted) (opBytes int64, ok bool, err error) {
	n, forgettable, opBytes, err := s.settleTokens(ctx, p.cs, cv.id, sp.opFirst, sp.opFloor, p.forget)
	s.passes.receipts.Add(uint64(n))
	if err != nil {
		return opBytes, false, err
	}
	out.Receipts += n
	if len(forgettable.entries) > 0 {
		// The floor goes just past the newest token forgotten, never
		// to forget itself: a clock that ran ahead would otherwise
		// persist a floor in the future, and every fresh token would
		// be token_expired until real time passed it.
		ok, err := s.raiseFloor(ctx, cv, forgettable.newest+1, resets)
		if err != nil || !ok {
			return opBytes, false, err
		}
		forgot, err := s.forgetTokens(forgettable.entries)
		s.passes.forgotten.Add(uint64(forgot))
		out.Forgotten += forgot
		if err != nil {
			return opBytes, false, fmt.Errorf("participant: forget a token of %v: %w", cv.id, err)
		}
	}
	// The receipts (and the checkpoint they rely on) must be durable
	// before the rows they stand in for are trimmed. The deletions
	// of forgotten entries need not precede the trims (an entry
	// naming a trimmed row without a receipt reads as not committed,
	// and the floor refuses its token), but the one flush orders
	// them too.
	if err := s.flush(cv.id); err != nil {
		return opBytes, false, fmt.Errorf("participant: write receipts of %v: %w", cv.id, err)
	}
	return opBytes, true, nil
}

// trimInSteps trims sp in steps of at most trimStep rows of each stream,
// each under cv's turn, so that the turn is never held much longer than a
// commit holds it. It reports false, with sp perhaps partly trimmed, when
// cv was reset since resets: its receipts may be gone, and a later pass
// writes them again, after the reconciliation.
func (s *Service) trimInSteps(ctx context.Context, cs store.Compactor, cv *conversation, sp trimSpan, resets uint64) (bool, error) {
	for opAt, obAt := sp.opFirst, sp.obFirst; opAt < sp.opFloor || obAt < sp.obFloor; {
		opTo, obTo := min(sp.opFloor, opAt+trimStep), min(sp.obFloor, obAt+trimStep)
		if err := cv.acquire(ctx); err != nil {
			return false, err
		}
		if cv.resets.Load() != resets {
			s.release(cv)
			return false, nil
		}
		err := s.trimTurn(cs, cv.id, opAt, opTo, obAt, obTo)
		s.release(cv)
		if err != nil {
			return false, err
		}
		opAt, obAt = max(opAt, opTo), max(obAt, obTo)
	}
	return true, nil
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
	_, row, ok := ck.FirstRetained()
	if !ok {
		return false
	}
	at, stored, err := s.committedAt(c, row)
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
