package participant

import (
	"context"
	"time"

	"github.com/participantd/participantd/oplog"
)

// Pipelined batches (docs/DESIGN.md, "Pipelined batches"). A batch of
// tells and acks hands the conversation's turn on once its rows are
// appended, before they are durable, so that the next batch is decided
// and appended while its commit is written. The next batch decides on
// the working state of the one in flight (prev), is answered only once
// prev's outcome is known and its own rows are durable, installs after
// it, and is in doubt whenever prev failed: its rows follow prev's in
// the store, and whatever it decided rests on them.
//
// Only under an Ownership that lets it (PipelinedOwnership: a batch
// decided on prev asks no Acquire, so its commit must fail if the right
// prev was decided under is lost) and under which the conversation's
// writes keep their order (OrderedOwnership: the log-first store, an etcd
// store's scope, the memory store of the tests): a crash then keeps a
// prefix of the writes, so the next batch's rows are never durable
// without prev's. Everything else that takes the turn
// first waits for the batch in flight (acquire, drain), as it relied on
// before: nothing of the conversation is written but by the turn's
// holder.

// pipelines reports whether b, decided from tasks, may hand the turn on
// before its commit is durable: it writes rows, every task is a tell or
// an ack, and it starts, ends or charges nothing (no fence lease, slot,
// registry entry or charge waits on its commit), under an Ownership that
// pipelines the conversation's batches and keeps its writes' order.
func (b *batch) pipelines(tasks []*task) bool {
	s := b.s
	if s.opts.NoPipeline || len(b.ops) == 0 || b.storeCharge != 0 || b.reservedSlot {
		return false
	}
	if !s.pipelinesOwnership(b.cv.id) || !s.keepsOrder(b.cv.id) {
		return false
	}
	for _, t := range tasks {
		if !t.plain {
			return false
		}
	}
	for _, o := range b.ops {
		if o.genesis != nil || o.binds || o.ending != nil || o.row.Kind != oplog.KindTell && o.row.Kind != oplog.KindAck {
			return false
		}
	}
	return true
}

// batchAfter returns the batch that decides after prev, in flight: on a
// clone of prev's working state. prev's install then leaves the records
// they share alone (install, cloned).
func (s *Service) batchAfter(cv *conversation, prev *batch) *batch {
	cv.mu.Lock()
	prev.cloned.Store(true)
	// prev's install will leave its payloads alone (cloned): they are
	// dropped past the window here, before st shares them, or a pipeline
	// that never drains would never drop them.
	cv.evictSharedLocked(prev.st)
	st := prev.st.Clone()
	cv.mu.Unlock()
	return &batch{s: s, cv: cv, live: prev.st, st: st, prev: prev}
}

// writePipelined commits b's rows as write does with one sync for both
// barriers, but hands the turn on (handOn) once they are appended: the
// next batch is decided and appended while b's commit is written. b is
// answered once its rows are durable and the batch before it (prev) has
// its outcome, and installs after prev; prev's rows precede b's in the
// store, so b's durable rows prove prev's durable too, but not prev's
// outcome: a prev that failed leaves b in doubt.
func (b *batch) writePipelined(handOn func()) error {
	s, cv := b.s, b.cv
	if _, err := b.appendRows(true); err != nil {
		// Its replays and refusals rest on prev's rows as its commits
		// do: answered once prev has its outcome, in doubt if it failed.
		return b.afterPrev(err)
	}
	b.done = make(chan struct{})
	cv.inflight = b
	handOn()
	sp := b.startBarrier(SpanSharedSync)
	timing, err := s.flushTimed(cv.id)
	endSpan(sp, err)
	what := "oplog and outbox flush"
	// Waited for whatever b's flush did, so that b's outcome is never
	// known before prev's (drain waits for the last batch handed on
	// alone).
	if perr := b.prevOutcome(); perr != nil && err == nil {
		err, what = perr, earlierCommit
	}
	if err != nil {
		return b.failHandedOn(what, err)
	}
	b.clock.flush = timing
	b.clock.durable = time.Now()
	b.install()
	return nil
}

// earlierCommit is the phase a batch fails in when the batch it was
// decided on failed.
const earlierCommit = "an earlier commit of the conversation"

// prevOutcome waits for the outcome of prev, the batch b was decided
// on, if any, and lets it go; when prev failed, every decision of b
// rested on its state, so every answer of b shares the failure
// (afterFailed), and prev's error is returned.
func (b *batch) prevOutcome() error {
	if b.prev == nil {
		return nil
	}
	from := time.Now()
	perr := b.prev.wait()
	b.clock.prevFrom, b.clock.prev = from, time.Since(from)
	b.prev = nil
	if perr != nil {
		b.afterFailed = true
	}
	return perr
}

// afterPrev returns err, the failure of b before it handed the turn on,
// once prev has its outcome: an error in doubt when prev failed. The
// caller holds the turn.
func (b *batch) afterPrev(err error) error {
	if perr := b.prevOutcome(); perr != nil {
		return &Error{Code: CodeInDoubt, Detail: earlierCommit, cause: perr}
	}
	return err
}

// failAfter fails b, decided on the state of the batch before it, which
// failed with perr (prevOutcome): b is in doubt, and undone as fail
// undoes it. The caller holds the turn.
func (b *batch) failAfter(perr error) error {
	for _, o := range b.ops {
		if o.binds {
			defer b.s.fences.SettleLease(o.bound)
		}
	}
	return b.fail(CodeInDoubt, earlierCommit, perr)
}

// failHandedOn fails b, whose commit (or prev's) failed after b handed
// the turn on: the conversation's state is forgotten, and reloaded in
// the background (as release reloads after fail). A pipelined batch has
// nothing else to undo (pipelines). The batches after b decided on its
// state and fail with it (failAfter, or here).
func (b *batch) failHandedOn(what string, err error) error {
	s, cv := b.s, b.cv
	b.clock.failed = true
	cv.mu.Lock()
	cv.forgetLocked()
	cv.mu.Unlock()
	if s.pinForReload(cv) {
		go s.reload(cv)
	}
	b.logInDoubt(what, err)
	return &Error{Code: CodeInDoubt, Detail: what, cause: err}
}

// finished reports whether b, a batch that handed the turn on, has its
// outcome.
func (b *batch) finished() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// wait returns b's outcome once it has one.
func (b *batch) wait() error {
	<-b.done
	return b.werr
}

// drain waits, holding cv's turn, until no batch that handed it on is in
// flight; a holder that is not a batch (a load, a checkpoint's write,
// compaction, the backlog's eviction) relies on nothing of cv being
// written but by itself.
func (cv *conversation) drain(ctx context.Context) error {
	b := cv.inflight
	if b == nil {
		return nil
	}
	select {
	case <-b.done:
		cv.inflight = nil
		return nil
	case <-ctx.Done():
		return &Error{Code: CodeUnavailable, Detail: "waiting for the conversation", cause: ctx.Err()}
	}
}

// idle reports, holding cv's turn, whether no batch that handed it on is
// in flight, for a holder that skips a busy conversation rather than wait.
func (cv *conversation) idle() bool {
	if b := cv.inflight; b != nil {
		if !b.finished() {
			return false
		}
		cv.inflight = nil
	}
	return true
}

// published returns the records the service retains and those of cv's
// published state, read together: what a batch's working state replaces
// once installed, and so what its additions are counted against
// (admitRecords). A batch decided on the state of one in flight counts
// against what is published, not against that state: the one in flight
// may install between the two reads otherwise, and its records would be
// counted twice or not at all.
func (b *batch) published() (records, published int64) {
	bl := b.s.backlog
	if b.prev == nil {
		return bl.records.Load(), int64(b.live.Records.Len())
	}
	b.cv.mu.RLock()
	defer b.cv.mu.RUnlock()
	if st := b.cv.state; st != nil {
		published = int64(st.Records.Len())
	}
	return bl.records.Load(), published
}

// Pipelined returns how many batches were decided while the batch before
// them, of the same conversation, was in flight: the server's
// participantd_batches_pipelined_total.
func (s *Service) Pipelined() uint64 { return s.pipelined.Load() }
