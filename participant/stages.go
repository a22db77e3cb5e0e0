package participant

import (
	"time"

	"github.com/participantd/participantd/store"
)

// Stages is where one operation's time went between its start and its
// outcome, for latency metrics (Call.Stages). The stages follow each
// other, so their sum is the time from the start to the outcome; a stage
// the operation did not pass is 0, and the flags say which it passed.
//
// The stages an operation shares with the others of its batch (Decide and
// after) are timed once per batch, not per operation.
//
// A batch whose writes failed (Failed) is timed to its failure: the
// stages before the one it failed in as usual, that one until the
// outcome (the failure's own time and its undoing), and none after it;
// its wait for the batch before it, if any, is Prev all the same.
type Stages struct {
	// Turn is from the start, when the operation was queued on its
	// conversation, until its batch began: the wait for the turn, held
	// by the batches before it.
	Turn time.Duration
	// Decide is from the batch's beginning until its barriers began: the
	// conversation's load if it was not loaded, every decision of the
	// batch (token lookups included), the rows' encoding and the oplog
	// appends; less Prev where the batch waited for the one before it
	// there (one that keeps the turn: it waits before its appends).
	Decide time.Duration
	// Oplog is barrier 1 on its own (the seal or flush of the oplog
	// rows), under an Ownership whose store does not keep a
	// conversation's writes in order (Split); 0 where barrier 1 shares
	// barrier 2's sync.
	Oplog time.Duration
	// CommitWait and Commit are barrier 2, or the sync both barriers
	// share, from the outbox appends on: the group commit's wait for the
	// commit that carries the rows to be taken (the commit before it, a
	// full memory bound), and the rest, that commit's write and sync
	// (store.FlushTiming). Under a store that does not divide its flush,
	// and for a flush that failed, all of it is Commit. A pipelined
	// batch's wait for the one before it, once its own flush returned,
	// is Prev, not Commit.
	CommitWait, Commit time.Duration
	// Prev is the wait of a batch decided while the batch before it was
	// in flight (Pipelined) for that batch's outcome: after its own
	// flush when it handed the turn on in turn, before its appends when
	// it keeps the turn (a replay, an enroll). It is taken out of the
	// stage it fell in, Commit or Decide.
	Prev time.Duration
	// Publish is from the rows' durability until the outcome was set:
	// the state's installation, publication and wakes. Only a batch that
	// made rows durable passes it (Barriers and not Failed).
	Publish time.Duration
	// Done is when the outcome was set; zero for an operation refused
	// before it reached a batch.
	Done time.Time
	// Barriers is set when the operation's batch wrote rows and reached
	// barrier 2 or the shared sync (CommitWait, Commit); the operation
	// may itself be a replay or refusal that shared them. Split is set
	// when barrier 1 was a seal or flush of its own (Oplog). Pipelined
	// is set when the batch was decided while the one before it was in
	// flight, and so waited for its outcome (Prev).
	Barriers, Split, Pipelined bool
	// Failed is set when the batch's load or writes failed: the
	// operation was answered with the failure, or shared a batch that
	// met it.
	Failed bool
}

// batchClock is the instants of one batch that its operations' Stages
// are made of. A failed batch sets failed and leaves durable zero: the
// stage it reached last runs until the outcome.
type batchClock struct {
	// began is when the batch began, decided when its barriers began
	// (zero: it wrote nothing, or failed before), durable when its rows
	// were.
	began, decided, durable time.Time
	// oplog is the time barrier 1 took on its own, once it returned.
	oplog time.Duration
	// prevFrom is when the batch began to wait for the outcome of the
	// batch it was decided on (prevOutcome; zero: it was not), and prev
	// how long it waited.
	prevFrom time.Time
	prev     time.Duration
	// flush is barrier 2's timing, set only when its flush succeeded
	// (store.TimedFlusher's timing means nothing otherwise).
	flush store.FlushTiming
	// split is set when barrier 1 began on its own, barriers when
	// barrier 2 (or the shared sync) began; failed when the batch
	// failed.
	split, barriers, failed bool
}

// stages returns the Stages of an operation started at started (zero:
// not timed) that the batch timed by k completed at done.
func (k *batchClock) stages(started, done time.Time) Stages {
	st := Stages{Done: done, Failed: k.failed, Pipelined: !k.prevFrom.IsZero(), Prev: k.prev}
	if !started.IsZero() && !k.began.IsZero() {
		st.Turn = k.began.Sub(started)
	}
	if k.decided.IsZero() {
		// The batch wrote nothing, or failed before its barriers (its
		// load, say): all of it was decide, but its wait for prev.
		if !k.began.IsZero() {
			st.Decide = done.Sub(k.began) - k.prev
		}
		return st
	}
	// The wait for prev is taken out of the stage it fell in: decide
	// when the batch waited before its barriers, else barrier 2 (a
	// pipelined batch waits once its own flush returned).
	prevInDecide := st.Pipelined && !k.prevFrom.After(k.decided)
	st.Decide = k.decided.Sub(k.began)
	if prevInDecide {
		st.Decide -= k.prev
	}
	// A failed batch's last stage runs until the outcome.
	end := k.durable
	if end.IsZero() {
		end = done
	}
	st.Split, st.Barriers = k.split, k.barriers
	if k.split {
		if !k.barriers {
			// Failed in barrier 1.
			st.Oplog = end.Sub(k.decided)
			if !prevInDecide {
				st.Oplog -= k.prev
			}
			return st
		}
		st.Oplog = k.oplog
	}
	barrier2 := end.Sub(k.decided) - st.Oplog
	if !prevInDecide {
		barrier2 -= k.prev
	}
	st.CommitWait = min(k.flush.Wait, barrier2)
	st.Commit = barrier2 - st.CommitWait
	if !k.failed {
		st.Publish = done.Sub(k.durable)
	}
	return st
}

// TimedOwnership is implemented by an Ownership that can say how a
// flush's time divided (store.FlushTiming), for Stages.
type TimedOwnership interface {
	// FlushTimed is Flush, with its timing.
	FlushTimed(c ConversationID) (store.FlushTiming, error)
}

// FlushTimed implements TimedOwnership with the store's timing.
func (o single) FlushTimed(ConversationID) (store.FlushTiming, error) { return store.FlushTimed(o.st) }

// flushTimed is flush, with its timing where the Ownership gives one and
// else all of it as Write.
func (s *Service) flushTimed(c ConversationID) (store.FlushTiming, error) {
	if o, ok := s.ownership().(TimedOwnership); ok {
		return o.FlushTimed(c)
	}
	return store.TimeFlush(func() error { return s.flush(c) })
}
