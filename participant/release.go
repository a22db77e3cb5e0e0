package participant

import (
	"context"
	"fmt"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// releaseStale bounds how long records wait for acknowledgement
// (Options.MaxUnackedAge): when c's oldest retained record committed
// before cutoff (unix ms), it commits a Release row giving up every
// retained record up to the newest that did, acknowledged or not. The
// row goes through the conversation's turn and both barriers like any
// operation, so a replay and every checkpoint derive the same state:
// the records reclaimed, and each member that lost some above its cursor
// marked (outbox.Member.Released), whose binding's next delivery is then
// the compacted notice. Compaction removes the released rows later by
// its usual rules, a checkpoint mark older than the retention. It returns
// how many retained records it gave up.
func (s *Service) releaseStale(ctx context.Context, cv *conversation, cutoff int64) (uint64, error) {
	first, last, ok := retainedSpan(cv)
	if !ok {
		return 0, nil
	}
	old, err := s.committedBy(cv, first, cutoff)
	if err != nil || !old {
		return 0, err
	}
	// The newest record that committed by cutoff: rows commit in seq
	// order, so their times ascend but for a clock that went back, which
	// at worst releases a record a little early or late.
	lo, hi := first, last
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		old, err := s.committedBy(cv, mid, cutoff)
		if err != nil {
			return 0, err
		}
		if old {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	through := lo
	var released uint64
	err = s.submit(ctx, cv, func(b *batch) func(error) error {
		if b.st.Records.Len() == 0 || b.st.Records.First() > through {
			return settled(nil) // acknowledged meanwhile
		}
		n := uint64(through - b.st.Records.First() + 1)
		row := oplog.Row{Kind: oplog.KindRelease, Through: through, At: b.s.now().UnixMilli()}
		if err := b.stage(&op{row: row}); err != nil {
			return settled(err)
		}
		return func(werr error) error {
			if werr == nil {
				released = n
			}
			return werr
		}
	})
	if err != nil {
		return 0, fmt.Errorf("participant: release the records of %v through %v: %w", cv.id, through, err)
	}
	return released, nil
}

// retainedSpan returns the seqs of cv's oldest and newest retained
// records, as its published state holds them.
func retainedSpan(cv *conversation) (first, last Seq, ok bool) {
	cv.mu.RLock()
	defer cv.mu.RUnlock()
	st := cv.state
	if st == nil || st.Records.Len() == 0 {
		return 0, 0, false
	}
	return st.Records.First(), st.LastSeq, true
}

// committedBy reports whether record q of cv committed at or before
// cutoff (unix ms), reading the oplog row that produced it. A record no
// longer retained was reclaimed, which only an older one can be first.
func (s *Service) committedBy(cv *conversation, q Seq, cutoff int64) (bool, error) {
	cv.mu.RLock()
	var rec outbox.Retained
	var retained bool
	if cv.state != nil {
		rec, retained = cv.state.Record(q)
	}
	source := rec.Source
	cv.mu.RUnlock()
	if !retained {
		return true, nil
	}
	at, stored, err := s.committedAt(cv.id, source)
	if err != nil {
		return false, err
	}
	// A row compacted away is older than anything retained.
	return !stored || at <= cutoff, nil
}
