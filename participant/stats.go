package participant

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of what a Service holds, for metrics.
type Stats struct {
	// Conversations is how many conversations the service knows of:
	// loaded, not loaded yet, dropped after a failed commit, or unloadable.
	Conversations int
	// Loaded is how many of them have their reconciled state in memory.
	Loaded int
	// Connections is how many Conns are open (not yet ended).
	Connections int
	// Bindings is how many bindings those connections hold.
	Bindings int
}

// Stats returns a snapshot of the service's contents. It visits every
// conversation and connection, each under its own lock briefly, so it
// costs O(conversations + connections): call it per scrape, not per
// operation.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	convs := make([]*conversation, 0, len(s.convs))
	for _, cv := range s.convs {
		convs = append(convs, cv)
	}
	conns := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	st := Stats{Conversations: len(convs)}
	for _, cv := range convs {
		cv.mu.RLock()
		if cv.state != nil {
			st.Loaded++
		}
		cv.mu.RUnlock()
	}
	for _, c := range conns {
		c.mu.Lock()
		if !c.ended {
			st.Connections++
			st.Bindings += len(c.bindings)
		}
		c.mu.Unlock()
	}
	return st
}

// PassKind names a background pass of the service.
type PassKind uint8

const (
	// PassCheckpoint is a CheckpointPass.
	PassCheckpoint PassKind = iota + 1
	// PassCompaction is a CompactPass.
	PassCompaction
)

// String returns "checkpoint" or "compaction".
func (k PassKind) String() string {
	switch k {
	case PassCheckpoint:
		return "checkpoint"
	case PassCompaction:
		return "compaction"
	}
	return fmt.Sprintf("PassKind(%d)", uint8(k))
}

// PassObserver is implemented by an Options.Observer that also wants one
// call per checkpoint or compaction pass that ended (a pass cut short by
// Close is not reported): how long it took and its error, nil when it
// succeeded. It is called from the pass's goroutine, without locks held.
type PassObserver interface {
	Pass(kind PassKind, d time.Duration, err error)
}

// SkipReason says why a checkpoint due was not written.
type SkipReason uint8

const (
	// SkipTooLarge: the checkpoint is larger than the store takes in one
	// value (etcd's request size); the conversation is not checkpointed.
	SkipTooLarge SkipReason = iota
	// SkipUnreadable: the conversation's stored checkpoint does not
	// decode, so it is not replaced (its next load refuses it).
	SkipUnreadable
	// SkipUnderivable: the stored rows do not derive through the pure
	// code (damage); no checkpoint is written.
	SkipUnderivable
	// SkipNotDurable: outbox rows of the range are not stored yet; a later
	// pass retries.
	SkipNotDurable
	// SkipForgotten: the conversation was forgotten (its ownership lost)
	// since the pass read its checkpoint, which may no longer be the
	// newest; the next owner's pass writes one.
	SkipForgotten

	numSkipReasons
)

// SkipReasons lists every SkipReason, in order.
var SkipReasons = [numSkipReasons]SkipReason{SkipTooLarge, SkipUnreadable, SkipUnderivable, SkipNotDurable, SkipForgotten}

// String returns the reason's label: too_large, unreadable, underivable,
// not_durable, forgotten.
func (r SkipReason) String() string {
	switch r {
	case SkipTooLarge:
		return "too_large"
	case SkipUnreadable:
		return "unreadable"
	case SkipUnderivable:
		return "underivable"
	case SkipNotDurable:
		return "not_durable"
	case SkipForgotten:
		return "forgotten"
	}
	return fmt.Sprintf("SkipReason(%d)", uint8(r))
}

// Lifecycle is a snapshot of what the checkpoint and compaction passes did
// since the service opened, for metrics. Counters only grow.
type Lifecycle struct {
	// CheckpointPasses and CompactionPasses count the passes that ended,
	// and the Failed ones those that returned an error (a failing store,
	// or a *PassFailures: some conversations failed); passes cut short by
	// Close are not counted.
	CheckpointPasses, CheckpointPassesFailed uint64
	CompactionPasses, CompactionPassesFailed uint64
	// CheckpointsWritten counts checkpoints made durable, and
	// CheckpointBytes their encoded bytes.
	CheckpointsWritten, CheckpointBytes uint64
	// CheckpointsSkipped counts, by SkipReason, checkpoints due that were
	// not written.
	CheckpointsSkipped [numSkipReasons]uint64
	// OplogRowsTrimmed and OutboxRowsTrimmed count the rows compaction
	// removed from each stream kind; OplogBytesTrimmed the stored bytes of
	// those oplog rows (compaction does not read the outbox rows it trims,
	// so their bytes are not known).
	OplogRowsTrimmed, OutboxRowsTrimmed, OplogBytesTrimmed uint64
	// ReceiptsWritten counts the receipts written for trimmed token rows.
	ReceiptsWritten uint64
	// TokensForgotten counts the token index entries compaction deleted
	// under the token window (Options.TokenWindow), instead of writing
	// receipts for their rows.
	TokensForgotten uint64
	// RecordsReleased counts the retained records compaction passes gave
	// up unacknowledged under Options.MaxUnackedAge.
	RecordsReleased uint64
	// ConversationFailures counts, by ConversationStep, the steps of the
	// passes that failed one conversation while the pass went on with the
	// others (passretry.go): each damaged conversation contained once,
	// each transient failure once per attempt, retried with backoff.
	ConversationFailures [numSteps]uint64
	// LastCheckpointPass and LastCompactionPass are when the last
	// successful pass of each kind ended; zero before the first.
	LastCheckpointPass, LastCompactionPass time.Time
	// Pinned is how many conversations, at the last compaction pass that
	// visited every conversation, held a record some recipient had not
	// acknowledged for longer than Options.Retain: their history from that
	// record on cannot be compacted until it is acknowledged (or the
	// member leaves). -1 before the first such pass.
	Pinned int
}

// passStats holds the counters behind Lifecycle. The zero value is ready.
type passStats struct {
	ckPasses, ckFailed, kPasses, kFailed atomic.Uint64
	ckWritten, ckBytes                   atomic.Uint64
	ckSkipped                            [numSkipReasons]atomic.Uint64
	opRows, obRows, opBytes, receipts    atomic.Uint64
	forgotten, released                  atomic.Uint64
	convFailed                           [numSteps]atomic.Uint64
	// lastCk and lastK are unix nanoseconds, 0 before the first.
	lastCk, lastK atomic.Int64
	// pinned is Lifecycle.Pinned + 1, so that its zero value means none
	// known yet.
	pinned atomic.Int64
}

// Lifecycle returns what the checkpoint and compaction passes did so far.
func (s *Service) Lifecycle() Lifecycle {
	p := &s.passes
	l := Lifecycle{
		CheckpointPasses: p.ckPasses.Load(), CheckpointPassesFailed: p.ckFailed.Load(),
		CompactionPasses: p.kPasses.Load(), CompactionPassesFailed: p.kFailed.Load(),
		CheckpointsWritten: p.ckWritten.Load(), CheckpointBytes: p.ckBytes.Load(),
		OplogRowsTrimmed: p.opRows.Load(), OutboxRowsTrimmed: p.obRows.Load(), OplogBytesTrimmed: p.opBytes.Load(),
		ReceiptsWritten: p.receipts.Load(), TokensForgotten: p.forgotten.Load(),
		RecordsReleased: p.released.Load(),
		Pinned:          int(p.pinned.Load()) - 1,
	}
	for i := range p.ckSkipped {
		l.CheckpointsSkipped[i] = p.ckSkipped[i].Load()
	}
	for i := range p.convFailed {
		l.ConversationFailures[i] = p.convFailed[i].Load()
	}
	if t := p.lastCk.Load(); t != 0 {
		l.LastCheckpointPass = time.Unix(0, t)
	}
	if t := p.lastK.Load(); t != 0 {
		l.LastCompactionPass = time.Unix(0, t)
	}
	return l
}

// skipped counts a checkpoint due that was not written.
func (p *passStats) skipped(r SkipReason) { p.ckSkipped[r].Add(1) }

// passEnded counts a pass of kind that began at start and ended with
// *errp, and tells the observer; a pass cut short because ctx ended is
// not counted.
func (s *Service) passEnded(ctx context.Context, kind PassKind, start time.Time, errp *error) {
	err := *errp
	if err != nil && ctx.Err() != nil {
		return
	}
	p := &s.passes
	now := s.now()
	switch kind {
	case PassCheckpoint:
		p.ckPasses.Add(1)
		if err != nil {
			p.ckFailed.Add(1)
		} else {
			p.lastCk.Store(now.UnixNano())
		}
	case PassCompaction:
		p.kPasses.Add(1)
		if err != nil {
			p.kFailed.Add(1)
		} else {
			p.lastK.Store(now.UnixNano())
		}
	}
	if po, ok := s.opts.Observer.(PassObserver); ok {
		po.Pass(kind, time.Since(start), err)
	}
}
