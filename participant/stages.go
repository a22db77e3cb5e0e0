package participant

import (
	"time"

	"github.com/participantd/participantd/store"
)

// Stages is where one operation's time went between its start and its
// outcome, for latency metrics (Call.Stages). The stages follow each
// other, so their sum is the time from the start to the outcome; a stage
// the operation did not pass is 0.
//
// The stages an operation shares with the others of its batch (Decide and
// after) are timed once per batch, not per operation.
type Stages struct {
	// Turn is from the start, when the operation was queued on its
	// conversation, until its batch began: the wait for the turn, held
	// by the batches before it.
	Turn time.Duration
	// Decide is from the batch's beginning until its barriers began: the
	// conversation's load if it was not loaded, every decision of the
	// batch (token lookups included), the rows' encoding and appends.
	Decide time.Duration
	// Oplog is barrier 1 on its own (the seal or flush of the oplog
	// rows), under an Ownership whose store does not keep a
	// conversation's writes in order; 0 where barrier 1 shares barrier
	// 2's sync.
	Oplog time.Duration
	// CommitWait and Commit are barrier 2, or the sync both barriers
	// share: the group commit's wait for the commit that carries the rows
	// to be taken (the commit before it, a full memory bound), and that
	// commit's write and sync (store.FlushTiming). Under a store that
	// does not divide its flush all of it is Commit.
	CommitWait, Commit time.Duration
	// Publish is from the rows' durability until the outcome was set:
	// the state's installation, publication and wakes.
	Publish time.Duration
	// Done is when the outcome was set; zero for an operation refused
	// before it reached a batch.
	Done time.Time
	// Barriers is set when the operation's batch wrote rows and waited
	// for its barriers (the operation may itself be a replay or refusal
	// that shared them); Split when barrier 1 was a seal or flush of its
	// own (Oplog).
	Barriers, Split bool
}

// batchClock is the instants of one batch that its operations' Stages
// are made of.
type batchClock struct {
	began, decided, durable time.Time
	oplog                   time.Duration
	flush                   store.FlushTiming
	barriers, split         bool
}

// stages returns the Stages of an operation started at started (zero:
// not timed) that the batch timed by k completed at done.
func (k *batchClock) stages(started, done time.Time) Stages {
	st := Stages{Done: done}
	if !started.IsZero() && !k.began.IsZero() {
		st.Turn = k.began.Sub(started)
	}
	if k.decided.IsZero() {
		// The batch failed before its barriers (its load, say).
		if !k.began.IsZero() {
			st.Decide = done.Sub(k.began)
		}
		return st
	}
	st.Decide = k.decided.Sub(k.began)
	if !k.barriers {
		st.Publish = done.Sub(k.decided)
		return st
	}
	st.Barriers, st.Split = true, k.split
	st.Oplog = k.oplog
	barrier2 := k.durable.Sub(k.decided) - k.oplog
	st.CommitWait = min(k.flush.Wait, barrier2)
	st.Commit = barrier2 - st.CommitWait
	st.Publish = done.Sub(k.durable)
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
	start := time.Now()
	err := s.flush(c)
	return store.FlushTiming{Write: time.Since(start)}, err
}
