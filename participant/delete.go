package participant

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// Deleting a conversation (docs/DESIGN.md, Data lifecycle: deletion).
//
// A conversation every participant has left, whose last row committed at
// least the retention ago (Service.retention: --retain, or the token window
// and its skew), is deleted by the compaction pass, in two steps:
//
//  1. A Delete row commits through the turn and both barriers like any
//     operation. From then on the conversation is deleted: every operation
//     on it, a retry of a committed token included, and every enroll into
//     its id, is answered retired; no row follows it.
//  2. Purge, under the turn: the token index and floor, the receipts and
//     the checkpoint go, and once that is durable both streams are trimmed
//     to their last row (a store keeps a stream's last row: the oplog's is
//     the Delete row). Purging is idempotent, and the trims are its last
//     writes, so a deleted conversation whose streams do not start at
//     their last rows has a purge to finish: its next load finishes it.
//
// A load recognizes a deleted conversation without anything the purge
// removes: a replay reaches the Delete row, and an oplog trimmed with no
// checkpoint left is read at its last row (reconcile), so a crash anywhere
// in the purge leaves a conversation that loads as deleted. Its entry
// leaves memory, its slot of MaxConversations and its share are given
// back, and the Ownership is told it may let the conversation go
// (Disowner). What stays is the registry entry and the last row of each
// stream, about a hundred bytes, which keep the id deleted for good: an
// id is never reused, since the participants minted in it and the tokens
// they committed would otherwise meet a second conversation under the
// same name.

// errDeleted answers every operation on deleted conversation c.
func errDeleted(c ConversationID) *Error {
	return refuse(CodeRetired, "conversation %v was deleted: every participant left it", c)
}

// Disowner is implemented by an Ownership that holds something for each
// conversation it granted (cluster mode: a claim under the node's lease):
// Disown lets conversation c go, because c was deleted and this service
// forgot it. It is advisory: a failure leaves the claim to end with the
// lease.
type Disowner interface {
	Disown(ctx context.Context, c ConversationID)
}

// deletable reports whether st may take a Delete row: every participant
// left and no record is retained.
func deletable(st *outbox.State) bool {
	return st != nil && !st.Deleted && st.AllLeft() && st.Records.Len() == 0
}

// deleteLeft deletes cv when every participant has left it and its last
// row committed at or before cutoff (unix ms). It reports whether it
// committed the Delete row; the purge's error is returned with true.
//
// A failure marks cv for the next pass (deleteRetry), which then takes
// cv's turn without looking at its published state first: a failed commit
// or purge dropped that state, and the load under the turn reads it back
// (a deleted conversation's load finishes its purge: loadedDeleted).
func (s *Service) deleteLeft(ctx context.Context, cv *conversation, cutoff int64) (bool, error) {
	retry := cv.deleteRetry.Load()
	if !retry {
		old, err := s.lastRowBy(cv, cutoff)
		if err != nil {
			cv.deleteRetry.Store(true)
			return false, fmt.Errorf("participant: delete %v: %w", cv.id, err)
		}
		if !old {
			return false, nil
		}
	}
	var deleted bool
	var perr error
	err := s.submit(ctx, cv, func(b *batch) func(error) error {
		if !deletable(b.st) || b.st.Applied == 0 {
			return settled(nil) // someone enrolled meanwhile
		}
		at, stored, err := s.committedAt(cv.id, b.st.Applied-1)
		if err != nil {
			return settled(unavailable("reading the conversation's last row", err))
		}
		if stored && at > cutoff {
			return settled(nil) // not old enough yet
		}
		idx := b.st.Applied
		if err := b.stage(&op{row: oplog.Row{Kind: oplog.KindDelete, At: s.now().UnixMilli()}}); err != nil {
			return settled(err)
		}
		return func(werr error) error {
			if werr != nil {
				return werr
			}
			// Still under the turn: nothing can run on cv between its
			// Delete row and the purge.
			deleted = true
			if perr = s.purgeTurn(cv, idx); perr != nil {
				// Its next load finishes the purge (loadedDeleted).
				cv.deleteRetry.Store(true)
				cv.drop()
				return nil
			}
			s.forgetDeleted(ctx, cv, true)
			return nil
		}
	})
	var pe *Error
	if retry && errors.As(err, &pe) && (pe.Code == CodeRetired || pe.Code == CodeMoved) {
		// Deleted, its purge finished by the load; or served by another
		// node now, whose loads finish it.
		cv.deleteRetry.Store(false)
		return false, nil
	}
	if err != nil {
		cv.deleteRetry.Store(true)
		return false, fmt.Errorf("participant: delete %v: %w", cv.id, err)
	}
	if perr != nil {
		return true, fmt.Errorf("participant: purge deleted %v: %w", cv.id, perr)
	}
	cv.deleteRetry.Store(false)
	return deleted, nil
}

// committedRow is when the last of applied oplog rows committed (unix ms;
// math.MinInt64 once compacted away, older than anything).
type committedRow struct {
	applied uint64
	at      int64
}

// lastRowBy reports whether cv's published state is deletable and its
// last row committed at or before cutoff: the check a pass makes of every
// conversation before it takes the turn. The row's time is read once per
// state (cv.lastRow): a conversation every participant left stays
// deletable for the whole retention, and a pass every few seconds must
// not read its last row each time.
func (s *Service) lastRowBy(cv *conversation, cutoff int64) (bool, error) {
	cv.mu.RLock()
	candidate := deletable(cv.state)
	var applied uint64
	if candidate {
		applied = cv.state.Applied
	}
	last := cv.lastRow
	cv.mu.RUnlock()
	if !candidate || applied == 0 {
		return false, nil
	}
	if last.applied != applied {
		at, stored, err := s.committedAt(cv.id, applied-1)
		if err != nil {
			return false, err
		}
		if !stored {
			at = math.MinInt64
		}
		last = committedRow{applied: applied, at: at}
		cv.mu.Lock()
		cv.lastRow = last
		cv.mu.Unlock()
	}
	return last.at <= cutoff, nil
}

// purgeTurn removes what deleted conversation cv stored besides its
// registry entry and the last row of each stream; its Delete row is oplog
// row at. The caller holds cv's turn. Idempotent; the oplog's trim goes
// last (see the top of this file).
func (s *Service) purgeTurn(cv *conversation, at uint64) error {
	cs, ok := store.AsCompactor(s.st)
	if !ok {
		return nil
	}
	c := cv.id
	tokens, err := s.st.Scan(tokenindex.ConversationPrefix(c))
	if err != nil {
		return fmt.Errorf("scan the token index: %w", err)
	}
	for _, v := range tokens {
		if err := s.st.CAS(v.Key, v.Value, 0); err != nil {
			return fmt.Errorf("delete token entry %s: %w", v.Key, err)
		}
	}
	// Receipts are keyed by the index of the row they stand for; only
	// rows before the Delete row can have one, in either version's key.
	var batch []store.Bytes
	for i := range at {
		batch = append(batch, store.Bytes{Key: receipt.Key(c, i)}, store.Bytes{Key: receipt.KeyV1(c, i)})
		if len(batch) >= 2*trimStep || i == at-1 {
			if err := cs.PutBytes(batch); err != nil {
				return fmt.Errorf("delete receipts: %w", err)
			}
			batch = batch[:0]
		}
	}
	if err := cs.PutBytes([]store.Bytes{{Key: checkpoint.Key(c)}}); err != nil {
		return fmt.Errorf("delete the checkpoint: %w", err)
	}
	// The checkpoint's deletion must be durable before the oplog's trim:
	// a checkpoint whose rows are gone is unloadable, while an oplog that
	// starts at its Delete row without one is what a load recognizes.
	if err := s.flush(c); err != nil {
		return err
	}
	if err := cs.Trim(oplog.Stream(c), at); err != nil {
		return fmt.Errorf("trim the oplog: %w", err)
	}
	if n, err := s.st.Len(outbox.Stream(c)); err != nil {
		return err
	} else if n > 1 {
		if err := cs.Trim(outbox.Stream(c), n-1); err != nil {
			return fmt.Errorf("trim the outbox: %w", err)
		}
	}
	return s.flush(c)
}

// purged reports whether deleted conversation c's purge finished: both
// streams start at their last row, its Delete row at at for the oplog.
func (s *Service) purged(c ConversationID, at uint64) (bool, error) {
	first, err := streamFirst(s.st, oplog.Stream(c))
	if err != nil || first < at {
		return false, err
	}
	n, err := s.st.Len(outbox.Stream(c))
	if err != nil || n == 0 {
		return err == nil, err
	}
	first, err = streamFirst(s.st, outbox.Stream(c))
	return first+1 >= n, err
}

// deletedAt returns the index of conversation c's Delete row when its
// oplog ends with one; ok is false for a conversation that is not deleted.
// A last row that does not decode is a ClassOplogCorrupt refusal.
func deletedAt(st store.DurableStore, c ConversationID) (at uint64, ok bool, err error) {
	n, err := st.Len(oplog.Stream(c))
	if err != nil || n == 0 {
		return 0, false, err
	}
	b, err := readOne(st, oplog.Stream(c), n-1)
	if err != nil || b == nil {
		return 0, false, err
	}
	row, err := oplog.Decode(b)
	if err != nil {
		return 0, false, &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", n-1, err)}
	}
	return n - 1, row.Kind == oplog.KindDelete, nil
}

// loadedDeleted is the load of conversation cv found deleted, its Delete
// row at oplog row at: it finishes a purge a crash interrupted, forgets
// the entry, and returns the refusal of every operation on it. The caller
// holds cv's turn.
func (s *Service) loadedDeleted(ctx context.Context, cv *conversation, at uint64) error {
	done, err := s.purged(cv.id, at)
	if err != nil {
		return unavailable("reading the deleted conversation", err)
	}
	if !done {
		if err := s.purgeTurn(cv, at); err != nil {
			return unavailable("purging the deleted conversation", err)
		}
	}
	// A purge this node's deletion left is finished as the deletion
	// would have: the Ownership may let the conversation go.
	s.forgetDeleted(ctx, cv, cv.deleteRetry.Swap(false))
	return errDeleted(cv.id)
}

// forgetDeleted marks cv deleted and lets it go: its slot of
// MaxConversations and its share are given back, and the entry leaves the
// map once no operation pins it (unpin). When disown is set (the deletion
// itself), the Ownership may let it go too; a later load of the deleted
// conversation keeps what the Ownership holds, so that requests on a
// deleted id cost reads, not a claim and its release each. The caller
// holds cv's turn.
func (s *Service) forgetDeleted(ctx context.Context, cv *conversation, disown bool) {
	cv.mu.Lock()
	cv.forgetLocked()
	cv.mu.Unlock()
	cv.settleParked() // a deleted conversation binds no one
	if cv.counted {
		cv.counted = false
		s.conversationSlots.release()
	}
	cv.deleted.Store(true)
	s.mu.Lock()
	if cv.pins == 0 && s.convs[cv.id] == cv {
		delete(s.convs, cv.id)
	}
	s.mu.Unlock()
	cv.uncharge()
	if d, ok := s.ownership().(Disowner); ok && disown {
		d.Disown(ctx, cv.id)
	}
}

// deletePass deletes every loaded conversation that deleteLeft would,
// the retention measured back from now (unix ms cutoff), and finishes the
// deletions an earlier pass failed (deleteRetry). It returns how many it
// deleted. One conversation's failure fails its own deletion step, in f
// (stepFailed: retried by a later pass, or contained), and the pass goes
// on with the others. A failed or closed store, or ctx ending, stops it
// at once and is returned.
func (s *Service) deletePass(ctx context.Context, cutoff int64, now time.Time, f *passFailures) (int, error) {
	n := 0
	for _, cv := range s.conversations() {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if cv.contained() || !stepDue(cv, StepDeletion, now) {
			continue
		}
		ok, err := s.deleteLeft(ctx, cv, cutoff)
		if ok {
			n++
		}
		if err == nil {
			stepDone(cv, StepDeletion)
			continue
		}
		if s.stepFailed(ctx, f, cv, StepDeletion, now, err) {
			return n, err
		}
	}
	return n, nil
}

// storeDown reports whether err, from one conversation's step of a pass,
// is the whole store's (failed or closed): it ends the pass rather than
// being left to a later one.
func storeDown(err error) bool {
	return errors.Is(err, store.ErrFailed) || errors.Is(err, store.ErrClosed)
}
