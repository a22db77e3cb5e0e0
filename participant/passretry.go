package participant

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/store"
)

// One conversation's failure in a background pass (docs/DESIGN.md, Fault
// model: "One conversation failing a background pass").
//
// The checkpoint pass, the compaction pass and the deletion pass it starts
// each do one step per conversation: derive and write its checkpoint,
// settle and trim its history, delete it. A step that fails fails its own
// conversation, never the pass:
//
//   - a failed or closed store (store.ErrFailed, store.ErrClosed) is every
//     conversation's failure, and the pass's ctx ending is the pass's:
//     either ends the pass at once (storeDown);
//   - damage (store.ErrCorrupt: a value failing its checksum) contains the
//     conversation as store_corrupt, as a lookup meeting it does
//     (containCorrupt): it is no longer served, and no pass touches it
//     again;
//   - anything else may pass (an etcd request that failed, a write refused
//     for a while): a later pass runs the step again, after a backoff
//     that grows with each failure in a row (stepBackoff) and ends with
//     the step's first success.
//
// Either way the failure is logged with its conversation, counted
// (Lifecycle.ConversationFailures), and the pass goes on with the other
// conversations; it returns a *PassFailures once it ran every other step.

// ConversationStep names the work a background pass does on one
// conversation.
type ConversationStep uint8

const (
	// StepCheckpoint derives and writes a conversation's checkpoint
	// (CheckpointPass).
	StepCheckpoint ConversationStep = iota
	// StepCompaction releases, settles and trims a conversation's history
	// (CompactPass).
	StepCompaction
	// StepDeletion deletes and purges a conversation every participant
	// left (CompactPass, delete.go).
	StepDeletion

	numSteps
)

// ConversationSteps lists every ConversationStep, in order.
var ConversationSteps = [numSteps]ConversationStep{StepCheckpoint, StepCompaction, StepDeletion}

// String returns the step's label: checkpoint, compaction, deletion.
func (s ConversationStep) String() string {
	switch s {
	case StepCheckpoint:
		return "checkpoint"
	case StepCompaction:
		return "compaction"
	case StepDeletion:
		return "deletion"
	}
	return fmt.Sprintf("ConversationStep(%d)", uint8(s))
}

// PassFailures is the error of a pass that ran every step it could but
// failed some conversations' (see above): those contained, and those a
// later pass retries. Unwrap returns the first failure, so errors.Is sees
// its cause (store.ErrCorrupt, a store's transient error).
type PassFailures struct {
	// Failed is how many conversations' steps failed in the pass.
	Failed int
	// Conversation is the first conversation that failed, and First its
	// failure.
	Conversation ConversationID
	First        error
}

func (e *PassFailures) Error() string {
	if e.Failed == 1 {
		return fmt.Sprintf("participant: conversation %v failed the pass: %v", e.Conversation, e.First)
	}
	return fmt.Sprintf("participant: %d conversations failed the pass, the first %v: %v", e.Failed, e.Conversation, e.First)
}

// Unwrap returns the first failure.
func (e *PassFailures) Unwrap() error { return e.First }

// passFailures collects the failed steps of one pass. The zero value is
// ready.
type passFailures struct {
	err *PassFailures
}

func (f *passFailures) add(c ConversationID, err error) {
	if f.err == nil {
		f.err = &PassFailures{Conversation: c, First: err}
	}
	f.err.Failed++
}

// result returns the pass's error: nil when no step failed.
func (f *passFailures) result() error {
	if f.err == nil {
		return nil
	}
	return f.err
}

// stepRetry is the backoff of one step of one conversation after it
// failed. Only the pass running the step writes it.
type stepRetry struct {
	// fails counts the step's failures in a row; 0 once it succeeds.
	fails atomic.Uint32
	// notBefore (unix ms) is when a pass may run the step again.
	notBefore atomic.Int64
}

// maxStepBackoff bounds the wait before a failed step runs again.
const maxStepBackoff = 5 * time.Minute

// stepBackoff returns how long to wait before running a step again after
// its fails-th failure in a row: nothing after the first (the next pass,
// a CheckpointInterval later, retries it), then the interval, doubling,
// up to maxStepBackoff, each drawn in its upper half so that steps that
// failed together (a store that refused them all for a while) are not
// all retried by the same pass.
func (s *Service) stepBackoff(fails uint32) time.Duration {
	if fails <= 1 {
		return 0
	}
	d := s.opts.CheckpointInterval
	if d <= 0 {
		d = DefaultCheckpointInterval
	}
	for i := uint32(2); i < fails && d < maxStepBackoff; i++ {
		d *= 2
	}
	d = min(d, maxStepBackoff)
	return d/2 + rand.N(d/2+1)
}

// stepDue reports whether a pass that started at now may run step on cv:
// not while the backoff of its last failure lasts.
func stepDue(cv *conversation, step ConversationStep, now time.Time) bool {
	r := &cv.retry[step]
	return r.fails.Load() == 0 || now.UnixMilli() >= r.notBefore.Load()
}

// stepDone notes that step ran on cv without failing: its backoff ends.
func stepDone(cv *conversation, step ConversationStep) {
	r := &cv.retry[step]
	if r.fails.Load() != 0 {
		r.fails.Store(0)
		r.notBefore.Store(0)
	}
}

// stepFailed handles err, the failure of step on cv in a pass started at
// now (see the top of this file). It reports true, having done nothing,
// when err ends the pass (a failed or closed store, ctx ended); otherwise
// it contains cv when err is damage, or holds the step back for a
// backoff, logs and counts the failure, and adds it to f.
func (s *Service) stepFailed(ctx context.Context, f *passFailures, cv *conversation, step ConversationStep, now time.Time, err error) (stop bool) {
	if storeDown(err) || ctx.Err() != nil {
		return true
	}
	s.passes.convFailed[step].Add(1)
	f.add(cv.id, err)
	if cv.contained() || errors.Is(err, store.ErrCorrupt) && s.containDamaged(ctx, cv, err) {
		// Logged when contained; no pass touches it any more.
		return false
	}
	r := &cv.retry[step]
	n := r.fails.Add(1)
	wait := s.stepBackoff(n)
	r.notBefore.Store(now.Add(wait).UnixMilli())
	s.log.Warn().Err(err).Uint64("conversation", uint64(cv.id)).Str("step", step.String()).Uint32("failures", n).
		Dur("retry_in", wait).Msg("a background pass failed one conversation; the others went on, and a later pass retries it")
	return false
}

// containDamaged contains cv, found damaged by err, under its turn
// (containCorrupt). It reports false when it could not take the turn.
func (s *Service) containDamaged(ctx context.Context, cv *conversation, err error) bool {
	if cv.acquire(ctx) != nil {
		return false
	}
	defer s.release(cv)
	return s.containCorrupt(cv, err)
}
