package participant

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// errNotDurable reports a checkpoint asked for rows whose outbox rows are
// not all stored yet; the caller tries again on a later pass.
var errNotDurable = errors.New("participant: outbox rows of the checkpoint's range are missing")

// derivePageBytes bounds a page of a stream a checkpoint derivation reads
// (a row larger than it is read alone). Its pages are read into one
// buffer each and dropped row by row, so a larger page saves read calls
// only; a page of ReadPageBytes (1 MiB) held a megabyte of oplog rows
// through every derivation, the highest peaks of a deaf reader's heap.
const derivePageBytes = 64 << 10

// checkpointBatchBytes bounds the checkpoints a pass stages (each with a
// PutBytes of its own) before it flushes them together.
const checkpointBatchBytes = 4 << 20

// deriveCheckpoint replays conversation c's rows from base (nil: from row
// 0) up to oplog row to, exclusive, through the same pure code a start
// runs, matching every outbox row those rows project against the stored
// one byte for byte, and returns the checkpoint at to, a Version4 one
// (checkpoint.Window). Every row below to must be durable with its outbox
// rows (the caller takes to from a published state). It never writes. A
// mismatch is a *refusal; outbox rows missing in the range are
// errNotDurable.
//
// What it holds besides a page of each stream is the replay's state, its
// records without payloads, and the outbox row of each (8 bytes a
// record): never a copy of every record in the checkpoint, nor an encoding
// of them.
func deriveCheckpoint(ctx context.Context, st store.DurableStore, c ConversationID, p pages, base *checkpoint.Checkpoint,
	to uint64, now time.Time, retain time.Duration) (*checkpoint.Checkpoint, error) {
	ck, _, err := derive(ctx, st, c, p, base, to, now, retain)
	return ck, err
}

// derive is deriveCheckpoint, also returning the rebuilder that replayed
// the rows (for rederive's comparison with an older checkpoint).
func derive(ctx context.Context, st store.DurableStore, c ConversationID, p pages, base *checkpoint.Checkpoint,
	to uint64, now time.Time, retain time.Duration) (*checkpoint.Checkpoint, *rebuilder, error) {
	// Each row is decoded and matched before the next is read, so a page
	// of many rows saves read calls only: a derivation reads in pages of
	// at most derivePageBytes (or one row), and what it holds of the
	// streams is bounded by that, not by ReadPageBytes.
	pageBytes := min(p.bytes, derivePageBytes)
	held, err := p.budget.acquire(ctx, 2*int64(pageBytes))
	if err != nil {
		return nil, nil, fmt.Errorf("participant: waiting to read %v: %w", c, err)
	}
	defer p.budget.release(held)
	rb := &rebuilder{state: &outbox.State{}, track: true, spacing: max(retain/16, time.Second).Milliseconds()}
	ck := &checkpoint.Checkpoint{Conversation: c}
	if base != nil {
		rb.state = base.State()
		if err := loadRetained(st, base, c, pageBytes, rb.state, rb.pos.add); err != nil {
			return nil, nil, err
		}
		rb.marks = append(rb.marks, base.Marks...)
		ck.OplogDigest, ck.OutboxDigest = base.OplogDigest, base.OutboxDigest
	}
	from := rb.state.Applied
	// Each row is decoded (its payload into scratch) and matched before
	// the next is read: both streams are read through a buffer each.
	ops, err := newBufferedPageReader(st, oplog.Stream(c), pageBytes, from)
	if err != nil {
		return nil, nil, err
	}
	if ops.end < to {
		return nil, nil, fmt.Errorf("%w: the oplog has %d rows, asked for %d", errNotDurable, ops.end, to)
	}
	ops.end = to
	stored, err := newBufferedPageReader(st, outbox.Stream(c), pageBytes, rb.state.Produced)
	if err != nil {
		return nil, nil, err
	}
	// Tracking drops every payload when its row is applied (rebuilder),
	// so one scratch holds each row's payload in turn.
	scratch := make([]byte, 0, 4<<10)
	for i := from; ops.more(); i++ {
		var b []byte
		var row oplog.Row
		var expected []outbox.Row
		b, row, expected, scratch, err = replayRowReusing(ops, rb.state, i, scratch)
		if err != nil {
			return nil, nil, err
		}
		for k := range expected {
			enc, err := encodeExpected(&expected[k])
			if err != nil {
				return nil, nil, err
			}
			if !stored.more() {
				return nil, nil, fmt.Errorf("%w: oplog row %d projects outbox row %d", errNotDurable, i, stored.next)
			}
			if err := matchStored(stored, enc, i); err != nil {
				return nil, nil, err
			}
			// enc is the stored row byte for byte.
			ck.OutboxDigest = sha256.Sum256(enc)
		}
		rb.apply(i, &row, expected)
		if i == to-1 {
			ck.OplogDigest = sha256.Sum256(b)
		}
	}
	rb.fill(ck, now, retain)
	return ck, rb, nil
}

// fill completes ck, the checkpoint of the rows rb replayed, from rb's
// state, the position of its first record and its marks (pruned to those
// retain still needs at now). A record without a position, or a
// checkpoint not well formed, is a broken invariant of the replay: it
// panics.
func (rb *rebuilder) fill(ck *checkpoint.Checkpoint, now time.Time, retain time.Duration) {
	s := rb.state
	c := ck.Conversation
	ck.Index, ck.Produced, ck.Nonce, ck.LastSeq = s.Applied, s.Produced, s.Nonce, s.LastSeq
	ck.Members = make([]checkpoint.Member, len(s.Members))
	for i, m := range s.Members {
		ck.Members[i] = checkpoint.Member{Generation: m.Generation, Retired: m.Retired, Cursor: m.Cursor,
			Bound: m.Bound, Conn: m.Conn, BindingSource: m.BindingSource}
		if m.Released > m.Cursor {
			ck.Released = append(ck.Released, checkpoint.Released{Member: ParticipantID(i), Through: m.Released})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(s.InviteUses)) {
		ck.Invites = append(ck.Invites, checkpoint.Invite{ID: id, Uses: s.InviteUses[id]})
	}
	ck.Window = &checkpoint.Window{First: firstKept(s), Oplog: s.Applied, Outbox: s.Produced}
	if s.Records.Len() > 0 {
		ck.Window.Oplog, ck.Window.Outbox = s.Records.At(0).Source, rb.outboxRow(c, s.Records.First())
	}
	ck.Marks = pruneMarks(rb.marks, now, retain)
	if err := ck.WellFormed(); err != nil {
		panic(fmt.Sprintf("participant: derived checkpoint of %v is not well formed: %v", c, err))
	}
}

// inline returns the records of rb's state with the rows that produced
// them, as a checkpoint of Versions 1 to 3 holds them.
func (rb *rebuilder) inline() []checkpoint.Record {
	recs := &rb.state.Records
	out := make([]checkpoint.Record, recs.Len())
	for i, r := range recs.All() {
		out[i] = checkpoint.Record{Record: r.Record(), Oplog: r.Source, Outbox: rb.outboxRow(0, r.Seq)}
	}
	return out
}

// outboxRow returns the outbox row that produced record q of c; it panics
// when rb does not know it, a broken invariant of the replay.
func (rb *rebuilder) outboxRow(c ConversationID, q Seq) uint64 {
	row, ok := rb.pos.row(q)
	if !ok {
		panic(fmt.Sprintf("participant: record %v of %v has no position", q, c))
	}
	return row
}

// CheckpointPass writes a checkpoint for every loaded conversation whose
// published state is at least Options.CheckpointRows rows past its
// checkpoint, reading at most Options.CheckpointPassRows oplog rows in all
// (a conversation further behind gets a checkpoint part of the way). It
// derives without the conversation's turn: it reads only rows a published
// state covers, which are durable and never change. It takes the turn only
// to stage the write, and writes nothing when the conversation was
// forgotten since it read the stored checkpoint (its ownership lost, and
// perhaps regained after another node checkpointed and compacted it): a
// checkpoint is never written over a newer one. It returns how many
// checkpoints it wrote, durable once it returns. The background
// checkpointer calls it every Options.CheckpointInterval; it is exported
// for offline tools and tests. A conversation whose rows do not derive is
// logged and skipped; one whose step fails otherwise fails alone
// (passretry.go): the pass checkpoints the others and returns a
// *PassFailures. A failed or closed store ends the pass and is returned.
func (s *Service) CheckpointPass(ctx context.Context) (int, error) {
	n, _, err := s.checkpointPass(ctx)
	return n, err
}

// checkpointPass is CheckpointPass; full reports that it stopped because
// its row budget ran out, with conversations possibly still behind.
func (s *Service) checkpointPass(ctx context.Context) (written int, full bool, err error) {
	cs, ok := store.AsCompactor(s.st)
	if !ok {
		return 0, false, nil
	}
	defer s.passEnded(ctx, PassCheckpoint, time.Now(), &err)
	now := s.now()
	convs := s.conversations()
	budget := uint64(s.opts.CheckpointPassRows)
	var fails passFailures
	b := checkpointBatch{s: s, ctx: ctx, now: now, fails: &fails}
	for _, cv := range convs {
		if budget == 0 || ctx.Err() != nil {
			break
		}
		if cv.contained() || !stepDue(cv, StepCheckpoint, now) {
			continue
		}
		staged, err := s.checkpointOne(ctx, cs, &b, cv, &budget)
		if err != nil {
			if s.stepFailed(ctx, &fails, cv, StepCheckpoint, now, err) {
				return b.written, budget == 0, err
			}
			continue
		}
		if !staged {
			stepDone(cv, StepCheckpoint)
		}
	}
	if err := b.flush(); err != nil {
		return b.written, budget == 0, err
	}
	return b.written, budget == 0, fails.result()
}

// checkpointOne is the checkpoint step of cv: it derives cv's checkpoint
// if one is due, within *budget rows (which it lowers by the rows read),
// and stages it in b. It reports whether it staged one, whose step ends
// when b flushes it; the error is the step's failure.
func (s *Service) checkpointOne(ctx context.Context, cs store.Compactor, b *checkpointBatch, cv *conversation, budget *uint64) (bool, error) {
	ck, resets, rows, err := s.dueCheckpoint(ctx, cv, *budget)
	if err != nil || ck == nil {
		return false, err
	}
	*budget -= rows
	enc, err := checkpoint.Encode(ck)
	if err != nil {
		return false, err
	}
	ok, err := s.stageCheckpoint(ctx, cs, cv, resets, enc)
	if err != nil || !ok {
		return false, err
	}
	return true, b.add(cv, resets, len(enc))
}

// dueCheckpoint derives cv's next checkpoint, if cv is loaded and its
// published state is at least Options.CheckpointRows rows past its stored
// checkpoint: at most budget rows past it. It returns the checkpoint, the
// resets of cv it was derived under, and how many rows it read; a nil
// checkpoint when none is due or cv is skipped (its checkpoint unreadable,
// its rows not deriving or not all durable yet: logged and counted; or cv
// forgotten meanwhile). The error is a failing store's.
func (s *Service) dueCheckpoint(ctx context.Context, cv *conversation, budget uint64) (ck *checkpoint.Checkpoint, resets, rows uint64, err error) {
	// Read before the state and the stored checkpoint, so that a
	// forgetting after either is seen when the write is staged.
	resets = cv.resets.Load()
	live := cv.loaded()
	if live == nil || live.Deleted {
		return nil, 0, 0, nil
	}
	applied := live.Applied
	base, err := loadCheckpoint(s.st, cv.id)
	var ref *refusal
	if errors.As(err, &ref) {
		s.passes.skipped(SkipUnreadable)
		s.log.Error().Uint64("conversation", uint64(cv.id)).Str("class", ref.class).Str("reason", ref.reason).
			Msg("checkpoint of a loaded conversation is unreadable; not replaced")
		return nil, 0, 0, nil
	}
	if err != nil {
		if cv.resets.Load() != resets {
			return nil, 0, 0, nil
		}
		return nil, 0, 0, err
	}
	var from uint64
	if base != nil {
		from = base.Index
	}
	if applied < from+uint64(s.opts.CheckpointRows) {
		return nil, 0, 0, nil
	}
	to := min(applied, from+budget)
	ck, err = deriveCheckpoint(ctx, s.st, cv.id, s.pages, base, to, s.now(), s.retention())
	switch {
	case errors.As(err, &ref):
		s.passes.skipped(SkipUnderivable)
		s.log.Error().Uint64("conversation", uint64(cv.id)).Str("class", ref.class).Str("reason", ref.reason).
			Msg("stored rows of a loaded conversation do not derive; no checkpoint written")
		return nil, 0, 0, nil
	case errors.Is(err, errNotDurable):
		s.passes.skipped(SkipNotDurable)
		return nil, 0, 0, nil
	case err != nil && cv.resets.Load() != resets:
		return nil, 0, 0, nil
	case err != nil:
		return nil, 0, 0, err
	}
	return ck, resets, to - from, nil
}

// checkpointBatch holds the checkpoints a pass has staged and not yet
// flushed, up to checkpointBatchBytes.
type checkpointBatch struct {
	s *Service
	// ctx, now and fails are the pass's: a conversation whose flush
	// fails fails its own step.
	ctx    context.Context
	now    time.Time
	fails  *passFailures
	staged []stagedCheckpoint
	bytes  int
	// written counts the checkpoints made durable.
	written int
}

// stagedCheckpoint is a checkpoint staged for cv under its resets.
type stagedCheckpoint struct {
	cv     *conversation
	resets uint64
	bytes  int
}

// add records a checkpoint of size bytes staged for cv, and flushes the
// batch once it holds checkpointBatchBytes. Its error ends the pass
// (flush).
func (b *checkpointBatch) add(cv *conversation, resets uint64, size int) error {
	b.staged = append(b.staged, stagedCheckpoint{cv, resets, size})
	if b.bytes += size; b.bytes >= checkpointBatchBytes {
		return b.flush()
	}
	return nil
}

// flush makes the staged checkpoints durable. A checkpoint must be
// durable before anything relies on it (a compaction's trim of the rows
// it replaces). Each conversation's barrier is its own (Ownership.Flush),
// so that in cluster mode a conversation lost to another node fails only
// itself: the first flush commits every staged checkpoint, the others
// find theirs done. A conversation forgotten since it was staged (its
// ownership lost: the scope and what was staged in it dropped) fails only
// its own checkpoint, never the pass: its next owner writes one. Any other
// failure of one conversation's flush fails its step (stepFailed); the
// error returned is one that ends the pass.
func (b *checkpointBatch) flush() error {
	s := b.s
	for _, sc := range b.staged {
		err := s.flush(sc.cv.id)
		if sc.cv.resets.Load() != sc.resets {
			s.passes.skipped(SkipForgotten)
			continue
		}
		if err != nil {
			err = fmt.Errorf("participant: write the checkpoint of %v: %w", sc.cv.id, err)
			if s.stepFailed(b.ctx, b.fails, sc.cv, StepCheckpoint, b.now, err) {
				return err
			}
			continue
		}
		stepDone(sc.cv, StepCheckpoint)
		b.written++
		s.passes.ckWritten.Add(1)
		s.passes.ckBytes.Add(uint64(sc.bytes))
	}
	b.staged, b.bytes = b.staged[:0], 0
	return nil
}

// stageCheckpoint writes enc as cv's checkpoint unless cv was forgotten
// since resets: under cv's turn, so that no reset can come between the
// check and the write (a claim, the only way to serve cv again, takes the
// turn), and a forgetting after the write discards it with the scope
// (cluster mode) before anything could commit it under a newer claim. It
// reports whether it staged the write. A checkpoint larger than the store
// takes is logged and skipped.
func (s *Service) stageCheckpoint(ctx context.Context, cs store.Compactor, cv *conversation, resets uint64, enc []byte) (bool, error) {
	if err := cv.acquire(ctx); err != nil {
		return false, err
	}
	defer s.release(cv)
	if cv.resets.Load() != resets {
		s.passes.skipped(SkipForgotten)
		return false, nil
	}
	err := cs.PutBytes([]store.Bytes{{Key: checkpoint.Key(cv.id), Value: enc}})
	if errors.Is(err, store.ErrTooLarge) {
		// A store whose values are bounded (etcd's request size) took
		// none of it: the others' checkpoints (and their compaction) do
		// not wait for it.
		s.passes.skipped(SkipTooLarge)
		s.log.Warn().Uint64("conversation", uint64(cv.id)).Int("bytes", len(enc)).Err(err).
			Msg("checkpoint larger than the store takes; the conversation is not checkpointed")
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("participant: write the checkpoint of %v: %w", cv.id, err)
	}
	return true, nil
}

// runCheckpoints is the background checkpointer: a CheckpointPass, then a
// CompactPass, every CheckpointInterval until ctx ends. Owned by the Service; Close waits for
// it.
func (s *Service) runCheckpoints(ctx context.Context) {
	t := time.NewTicker(s.opts.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Each pass is bounded; while one ends with its budget spent, the
		// next follows at once, so the passes keep up with any write rate
		// the machine can sustain instead of one budget per interval.
		// A pass that failed some conversations alone (*PassFailures)
		// logged each and did the others: the lifecycle goes on.
		var pf *PassFailures
		for behind := true; behind && ctx.Err() == nil; {
			n, cfull, err := s.checkpointPass(ctx)
			if err != nil && !errors.As(err, &pf) {
				if ctx.Err() == nil {
					s.log.Warn().Err(err).Msg("checkpoint pass failed; retrying at the next interval")
				}
				break
			}
			if n > 0 {
				s.log.Debug().Int("checkpoints", n).Msg("checkpoints written")
			}
			got, kfull, err := s.compactPass(ctx)
			if err != nil && !errors.As(err, &pf) {
				if ctx.Err() == nil {
					s.log.Warn().Err(err).Msg("compaction pass failed; retrying at the next interval")
				}
				break
			}
			if got.Deleted > 0 {
				s.log.Info().Int("conversations", got.Deleted).Msg("conversations every participant left deleted")
			}
			if got.Conversations > 0 {
				s.log.Debug().Int("conversations", got.Conversations).Uint64("oplog_rows", got.OplogRows).
					Uint64("outbox_rows", got.OutboxRows).Int("receipts", got.Receipts).Msg("history compacted")
			}
			behind = cfull || kfull
		}
	}
}
