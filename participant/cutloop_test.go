package participant

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// answered is an operation that got a success answer before the cut, with
// a way to check, after the restart, that its retry replays that answer.
type answered struct {
	what  string
	check func(ctx context.Context, c *Conn) error
}

// cutWorkload drives every operation kind through one service and records
// what was answered. It stops at the first failure, which after a cut is
// every operation.
func cutWorkload(s *faultstore.Store, log *[]answered) error {
	ctx := context.Background()
	*log = (*log)[:0]
	// Every pass checkpoints every conversation with a row past its
	// checkpoint, so that checkpoint writing meets every cut point too.
	svc, err := Open(ctx, s, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Nanosecond})
	if err != nil {
		return err
	}
	// ... and compacts everything settled at once, so that receipts and
	// trims meet every cut point as well.
	checkpoint := func() error {
		if _, err := svc.CheckpointPass(ctx); err != nil {
			return err
		}
		_, err := svc.CompactPass(ctx)
		return err
	}
	// The cut loop crashes the store once the workload returns: nothing
	// may still be using it.
	defer svc.Close()
	ca, cb, cc := svc.Connect(nil), svc.Connect(nil), svc.Connect(nil)
	enroll := func(c *Conn, conv ConversationID, tok byte) (Bound, error) {
		req := Enroll{Conversation: conv, Token: token(tok)}
		b, err := c.Enroll(ctx, req)
		if err == nil {
			*log = append(*log, answered{fmt.Sprintf("enroll %v/%x", conv, tok), func(ctx context.Context, c *Conn) error {
				r, err := c.Enroll(ctx, req)
				return sameBound(b, r, err)
			}})
		}
		return b, err
	}
	tell := func(c *Conn, who Bound, tok byte, payload string) (Told, error) {
		req := Tell{Conversation: who.Conversation, Participant: who.Participant, Generation: who.Generation, Token: token(tok), Payload: []byte(payload)}
		t, err := c.Tell(ctx, req)
		if err == nil {
			*log = append(*log, answered{fmt.Sprintf("tell %x", tok), func(ctx context.Context, c *Conn) error {
				r, err := c.Tell(ctx, req)
				if err != nil || r.Seq != t.Seq || r.Replay != ReplayCommitted {
					return fmt.Errorf("replay = %+v, %v; want seq %v committed", r, err, t.Seq)
				}
				return nil
			}})
		}
		return t, err
	}
	a, err := enroll(ca, 1, 0x11)
	if err != nil {
		return err
	}
	b, err := enroll(cb, 1, 0x12)
	if err != nil {
		return err
	}
	t1, err := tell(ca, a, 0x21, "one")
	if err != nil {
		return err
	}
	if _, err := cb.Ack(ctx, Ack{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Through: t1.Seq}); err != nil {
		return err
	}
	*log = append(*log, answered{"ack", func(ctx context.Context, c *Conn) error {
		return recorded(c.svc.st, 1, func(row outbox.Row) bool {
			return row.Kind == outbox.AckAdvanced && row.Participant == b.Participant && row.Through == t1.Seq
		})
	}})
	// b re-attaches from another connection, superseding its binding.
	attReq := Attach{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: token(0x31)}
	b2, err := cc.Attach(ctx, attReq)
	if err != nil {
		return err
	}
	*log = append(*log, answered{"attach", func(ctx context.Context, c *Conn) error {
		r, err := c.Attach(ctx, attReq)
		return sameBound(b2, r, err)
	}})
	if err := checkpoint(); err != nil {
		return err
	}
	if _, err := tell(cc, b2, 0x22, "two"); err != nil {
		return err
	}
	detReq := Detach{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Token: token(0x41)}
	det, err := ca.Detach(ctx, detReq)
	if err != nil {
		return err
	}
	*log = append(*log, answered{"detach", func(ctx context.Context, c *Conn) error {
		r, err := c.Detach(ctx, detReq)
		if err != nil || r.Seq != det.Seq || r.Replay != ReplayCommitted {
			return fmt.Errorf("replay = %+v, %v; want seq %v", r, err, det.Seq)
		}
		return nil
	}})
	leaveReq := Leave{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret, Token: token(0x51)}
	left, err := cb.Leave(ctx, leaveReq)
	if err != nil {
		return err
	}
	*log = append(*log, answered{"leave", func(ctx context.Context, c *Conn) error {
		r, err := c.Leave(ctx, leaveReq)
		if err != nil || r.Seq != left.Seq || r.Replay != ReplayCommitted {
			return fmt.Errorf("replay = %+v, %v; want seq %v", r, err, left.Seq)
		}
		return nil
	}})
	if _, err := enroll(ca, 2, 0x13); err != nil {
		return err
	}
	b3, err := enroll(cb, 2, 0x14)
	if err != nil {
		return err
	}
	if err := cb.End(ctx, oplog.CauseConnectionLost); err != nil {
		return err
	}
	*log = append(*log, answered{"end", func(ctx context.Context, c *Conn) error {
		// The ending End returned from is recorded with its own cause, not
		// as the restart's unclean_restart.
		return recorded(c.svc.st, 2, func(row outbox.Row) bool {
			for _, r := range row.Records {
				if r.Participant == b3.Participant && r.Kind == outbox.KindDied && r.Cause == oplog.CauseConnectionLost {
					return true
				}
			}
			return false
		})
	}})
	if err := checkpoint(); err != nil {
		return err
	}
	if err := ca.End(ctx, oplog.CauseClean); err != nil {
		return err
	}
	return checkpoint()
}

// recorded reports an error unless conversation conv's stored outbox has a
// row matching match.
// A row compacted away was durable and settled: it counts as recorded.
func recorded(st store.DurableStore, conv ConversationID, match func(outbox.Row) bool) error {
	rows, first, err := storedOutbox(st, conv)
	if err != nil {
		return err
	}
	if first > 0 {
		return nil
	}
	for _, row := range rows {
		if match(row) {
			return nil
		}
	}
	return fmt.Errorf("conversation %v: the answered operation's outbox row is missing", conv)
}

// storedOutbox returns the outbox rows conv still stores, and the seq of
// the first.
func storedOutbox(st store.DurableStore, conv ConversationID) ([]outbox.Row, uint64, error) {
	first, err := streamFirst(st, outbox.Stream(conv))
	if err != nil {
		return nil, 0, err
	}
	entries, err := st.ReadFrom(outbox.Stream(conv), first, 0)
	if err != nil {
		return nil, 0, err
	}
	payloads := make([][]byte, len(entries))
	for i, e := range entries {
		payloads[i] = e.Payload
	}
	rows, err := outbox.Validate(payloads)
	return rows, first, err
}

func sameBound(want, got Bound, err error) error {
	var pe *Error
	if errors.As(err, &pe) && pe.Code == CodeReceiptExpired && pe.Reason == "superseded" && pe.Generation > want.Generation {
		return nil
	}
	if err != nil {
		return err
	}
	if got.Participant != want.Participant || got.Generation != want.Generation || got.Secret != want.Secret ||
		got.Cursor != want.Cursor || !got.ReceiptExpiresAt.Equal(want.ReceiptExpiresAt) || got.Replay == ReplayNone {
		return fmt.Errorf("replay = %+v, want %+v marked as a replay", got, want)
	}
	return nil
}

// checkInvariants reopens mem and checks the contract after a crash.
func checkInvariants(t faultstore.TB, mem store.DurableStore, log []answered) {
	ctx := context.Background()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	if unl := svc.Unloadable(); len(unl) != 0 {
		t.Fatalf("a crash made conversations unloadable: %+v", unl)
	}
	// The outbox equals the projection of the oplog byte for byte.
	reports, err := Inspect(mem)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	for _, r := range reports {
		if r.Refused != nil || r.Repairs != 0 {
			t.Fatalf("after reconciliation, conversation %v: refused=%+v repairs=%d", r.Conversation, r.Refused, r.Repairs)
		}
		rows, first, err := storedOutbox(mem, r.Conversation)
		if err != nil {
			t.Fatalf("outbox of %v: %v", r.Conversation, err)
		}
		checkRecords(t, rows, first > 0)
	}
	checkCheckpoints(t, mem)
	// Every answered operation's retry replays its answer.
	c := svc.Connect(nil)
	for _, a := range log {
		if err := a.check(ctx, c); err != nil {
			t.Fatalf("answered %s: %v", a.what, err)
		}
	}
}

// checkRecords checks that record seqs run from 1 (from the first stored,
// when the outbox was compacted) without gap or duplicate, and that each
// binding ends at most once and only after it began (where the compacted
// prefix hides its start, after it was first seen).
func checkRecords(t faultstore.TB, rows []outbox.Row, compacted bool) {
	var next Seq = 1
	bound := map[ParticipantID]bool{}
	seen := map[ParticipantID]bool{}
	for _, row := range rows {
		for _, rec := range row.Records {
			if compacted && next == 1 {
				next = rec.Seq
			}
			if compacted && !seen[rec.Participant] {
				seen[rec.Participant] = true
				// A tell or an ending needs a binding that began before.
				bound[rec.Participant] = rec.Kind == outbox.KindRecord || rec.Kind == outbox.KindDetached || rec.Kind == outbox.KindDied
			}
			if rec.Seq != next {
				t.Fatalf("record seq %v, want %v: a gap or a duplicate", rec.Seq, next)
			}
			next++
			p := rec.Participant
			switch rec.Kind {
			case outbox.KindJoined, outbox.KindAttached:
				if bound[p] {
					t.Fatalf("%v bound at seq %v while its binding was live", p, rec.Seq)
				}
				bound[p] = true
			case outbox.KindDetached, outbox.KindDied:
				if !bound[p] {
					t.Fatalf("%v's binding ended twice, or before it began, at seq %v", p, rec.Seq)
				}
				bound[p] = false
			case outbox.KindLeft:
				bound[p] = false
			}
		}
	}
}

// TestCrashCutAtEveryOperation cuts the workload at every store operation
// in turn, restarts on what was flushed, and checks the contract: every
// answered operation is there and replays, the outbox is the projection
// of the oplog, seqs have no gap or duplicate, and each binding ended at
// most once.
func TestCrashCutAtEveryOperation(t *testing.T) {
	var log []answered
	runs := 0
	faultstore.CutLoop{
		Workload: func(s *faultstore.Store) error { return cutWorkload(s, &log) },
		Check: func(t faultstore.TB, mem *store.Memory, run faultstore.CutRun) {
			runs++
			checkInvariants(t, mem, log)
			if run.Completed {
				for _, id := range []ConversationID{1, 2} {
					if ck, err := loadCheckpoint(mem, id); err != nil || ck == nil {
						t.Fatalf("after the completed run, conversation %v has no checkpoint (%v)", id, err)
					}
				}
				// Everything of conversation 1 was settled: its retries
				// above replayed from receipts.
				if first, err := mem.First(oplog.Stream(1)); err != nil || first == 0 {
					t.Fatalf("after the completed run, conversation 1 was not compacted (first row %d, %v)", first, err)
				}
			}
		},
	}.Run(t)
	if runs < 50 {
		t.Fatalf("the cut loop ran %d times; the workload should make far more store operations", runs)
	}
	t.Logf("cut at %d operation indices", runs)
}

// checkCheckpoints checks that every stored checkpoint is what a replay
// from row 0 derives at its index, while row 0 is stored (rederive).
func checkCheckpoints(t faultstore.TB, mem store.DurableStore) {
	ids, err := readRegistry(mem)
	if err != nil {
		t.Fatalf("readRegistry: %v", err)
	}
	p := pages{budget: newByteBudget(2 * DefaultReadPageBytes), bytes: DefaultReadPageBytes}
	for _, id := range ids {
		if err := rederive(context.Background(), mem, id, p); err != nil {
			t.Fatalf("checkpoint of %v: %v", id, err)
		}
	}
}
