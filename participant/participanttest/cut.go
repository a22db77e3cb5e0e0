package participanttest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// NodeKey is the node key of the services CutWorkload and CheckCut open.
var NodeKey = make([]byte, participant.NodeKeySize)

// Answered is an operation that got a success answer before the cut, with
// a way to check, after the restart, that its retry replays that answer.
type Answered struct {
	What string
	// Check retries the operation from c, a connection of a service over
	// st, and reports an error unless it replays the answer.
	Check func(ctx context.Context, c *participant.Conn, st store.DurableStore) error
}

// TokenOf returns the token all of whose bytes are b.
func TokenOf(b byte) participant.Token {
	var t participant.Token
	for i := range t {
		t[i] = b
	}
	return t
}

// CutWorkload drives every operation kind through one service over s and
// records in *log what was answered. It stops at the first failure, which
// after a cut is every operation. The service is closed when it returns,
// so the caller may crash the store at once.
func CutWorkload(s store.DurableStore, log *[]Answered) error {
	ctx := context.Background()
	*log = (*log)[:0]
	// Every pass checkpoints every conversation with a row past its
	// checkpoint, so that checkpoint writing meets every cut point too,
	// and compacts everything settled at once, so that receipts and trims
	// meet every cut point as well.
	svc, err := participant.Open(ctx, s, participant.Options{NodeKey: NodeKey, CheckpointRows: 1, Retain: time.Nanosecond})
	if err != nil {
		return err
	}
	// The cut loop crashes the store once the workload returns: nothing
	// may still be using it.
	defer svc.Close()
	ca, cb, cc := svc.Connect(nil), svc.Connect(nil), svc.Connect(nil)
	enroll := func(c *participant.Conn, conv participant.ConversationID, tok byte) (participant.Bound, error) {
		req := participant.Enroll{Conversation: conv, Token: TokenOf(tok)}
		b, err := c.Enroll(ctx, req)
		if err == nil {
			*log = append(*log, Answered{fmt.Sprintf("enroll %v/%x", conv, tok), func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
				r, err := c.Enroll(ctx, req)
				return sameBound(b, r, err)
			}})
		}
		return b, err
	}
	tell := func(c *participant.Conn, who participant.Bound, tok byte, payload string) (participant.Told, error) {
		req := participant.Tell{Conversation: who.Conversation, Participant: who.Participant, Generation: who.Generation, Token: TokenOf(tok), Payload: []byte(payload)}
		t, err := c.Tell(ctx, req)
		if err == nil {
			*log = append(*log, toldAnswered(fmt.Sprintf("tell %x", tok), req, t, false))
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
	if _, err := cb.Ack(ctx, participant.Ack{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Through: t1.Seq}); err != nil {
		return err
	}
	*log = append(*log, Answered{"ack", func(ctx context.Context, c *participant.Conn, st store.DurableStore) error {
		return recorded(st, 1, func(row outbox.Row) bool {
			return row.Kind == outbox.AckAdvanced && row.Participant == b.Participant && row.Through == t1.Seq
		})
	}})
	// b re-attaches from another connection, superseding its binding.
	attReq := participant.Attach{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: TokenOf(0x31)}
	b2, err := cc.Attach(ctx, attReq)
	if err != nil {
		return err
	}
	*log = append(*log, Answered{"attach", func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
		r, err := c.Attach(ctx, attReq)
		return sameBound(b2, r, err)
	}})
	if err := passes(ctx, svc); err != nil {
		return err
	}
	if _, err := tell(cc, b2, 0x22, "two"); err != nil {
		return err
	}
	detReq := participant.Detach{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Token: TokenOf(0x41)}
	det, err := ca.Detach(ctx, detReq)
	if err != nil {
		return err
	}
	*log = append(*log, Answered{"detach", func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
		r, err := c.Detach(ctx, detReq)
		if err != nil || r.Seq != det.Seq || r.Replay != participant.ReplayCommitted {
			return fmt.Errorf("replay = %+v, %v; want seq %v", r, err, det.Seq)
		}
		return nil
	}})
	leaveReq := participant.Leave{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret, Token: TokenOf(0x51)}
	left, err := cb.Leave(ctx, leaveReq)
	if err != nil {
		return err
	}
	*log = append(*log, Answered{"leave", func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
		r, err := c.Leave(ctx, leaveReq)
		if err != nil || r.Seq != left.Seq || r.Replay != participant.ReplayCommitted {
			return fmt.Errorf("replay = %+v, %v; want seq %v", r, err, left.Seq)
		}
		return nil
	}})
	a3, err := enroll(ca, 2, 0x13)
	if err != nil {
		return err
	}
	b3, err := enroll(cb, 2, 0x14)
	if err != nil {
		return err
	}
	if err := cb.End(ctx, oplog.CauseConnectionLost); err != nil {
		return err
	}
	*log = append(*log, Answered{"end", func(ctx context.Context, c *participant.Conn, st store.DurableStore) error {
		// The ending End returned from is recorded with its own cause, not
		// as the restart's unclean_restart.
		return recorded(st, 2, func(row outbox.Row) bool {
			for _, r := range row.Records {
				if r.Participant == b3.Participant && r.Kind == outbox.KindDied && r.Cause == oplog.CauseConnectionLost {
					return true
				}
			}
			return false
		})
	}})
	if err := passes(ctx, svc); err != nil {
		return err
	}
	// The operator evicts a3, bound on ca: a leave without a token.
	if _, err := svc.Evict(ctx, 2, a3.Participant); err != nil {
		return err
	}
	*log = append(*log, Answered{"evict", func(ctx context.Context, c *participant.Conn, st store.DurableStore) error {
		return recorded(st, 2, func(row outbox.Row) bool {
			for _, r := range row.Records {
				if r.Participant == a3.Participant && r.Kind == outbox.KindLeft && r.Cause == oplog.CauseEvicted {
					return true
				}
			}
			return false
		})
	}})
	if err := deletedWorkload(ctx, svc, log); err != nil {
		return err
	}
	if err := ca.End(ctx, oplog.CauseClean); err != nil {
		return err
	}
	return passes(ctx, svc)
}

// deletedWorkload is CutWorkload's conversation 3: two participants
// enroll, one tells, both leave, and the next pass deletes it (Retain is a
// nanosecond), so that the Delete row and the purge meet every cut point.
// Each answered operation's retry must replay it while the conversation is
// not deleted, and be refused retired once it is.
func deletedWorkload(ctx context.Context, svc *participant.Service, log *[]Answered) error {
	const conv = 3
	// Acting for a principal, its first commit stores the conversation's
	// charge: that write meets every cut point too, and the purge must
	// remove it (CheckPurged).
	conns := []*participant.Conn{svc.ConnectAs("cut", nil), svc.ConnectAs("cut", nil)}
	answered := func(what string, retry func(context.Context, *participant.Conn) error) {
		*log = append(*log, Answered{what, func(ctx context.Context, c *participant.Conn, st store.DurableStore) error {
			deleted, err := Deleted(st, conv)
			if err != nil {
				return err
			}
			err = retry(ctx, c)
			var pe *participant.Error
			if deleted && (!errors.As(err, &pe) || pe.Code != participant.CodeRetired) {
				return fmt.Errorf("retry in the deleted conversation = %v, want retired", err)
			}
			if !deleted && err != nil {
				return fmt.Errorf("retry = %w", err)
			}
			return nil
		}})
	}
	var who []participant.Bound
	for i, tok := range []byte{0x15, 0x16} {
		req := participant.Enroll{Conversation: conv, Token: TokenOf(tok)}
		b, err := conns[i].Enroll(ctx, req)
		if err != nil {
			return err
		}
		who = append(who, b)
		answered(fmt.Sprintf("enroll %v/%x", conv, tok), func(ctx context.Context, c *participant.Conn) error {
			r, err := c.Enroll(ctx, req)
			if err != nil {
				return err
			}
			return sameBound(b, r, nil)
		})
	}
	tellReq := participant.Tell{Conversation: conv, Participant: who[0].Participant, Generation: who[0].Generation, Token: TokenOf(0x23), Payload: []byte("three")}
	told, err := conns[0].Tell(ctx, tellReq)
	if err != nil {
		return err
	}
	answered("tell in 3", func(ctx context.Context, c *participant.Conn) error {
		r, err := c.Tell(ctx, tellReq)
		if err == nil && (r.Seq != told.Seq || r.Replay != participant.ReplayCommitted) {
			return fmt.Errorf("replay = %+v, want seq %v", r, told.Seq)
		}
		return err
	})
	for i, b := range who {
		req := participant.Leave{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: TokenOf(0x52 + byte(i))}
		left, err := conns[i].Leave(ctx, req)
		if err != nil {
			return err
		}
		answered(fmt.Sprintf("leave %v in 3", b.Participant), func(ctx context.Context, c *participant.Conn) error {
			r, err := c.Leave(ctx, req)
			if err == nil && (r.Seq != left.Seq || r.Replay != participant.ReplayCommitted) {
				return fmt.Errorf("replay = %+v, want seq %v", r, left.Seq)
			}
			return err
		})
	}
	return passes(ctx, svc)
}

// Deleted reports whether conversation conv of st was deleted: its oplog
// ends with a Delete row.
func Deleted(st store.DurableStore, conv participant.ConversationID) (bool, error) {
	n, err := st.Len(oplog.Stream(conv))
	if err != nil || n == 0 {
		return false, err
	}
	entries, err := st.ReadFrom(oplog.Stream(conv), n-1, 1)
	if err != nil || len(entries) != 1 {
		return false, fmt.Errorf("last oplog row of %v: %d entries, %v", conv, len(entries), err)
	}
	row, err := oplog.Decode(entries[0].Payload)
	if err != nil {
		return false, err
	}
	return row.Kind == oplog.KindDelete, nil
}

// recorded reports an error unless conversation conv's stored outbox has a
// row matching match.
// A row compacted away was durable and settled: it counts as recorded.
func recorded(st store.DurableStore, conv participant.ConversationID, match func(outbox.Row) bool) error {
	rows, first, err := StoredOutbox(st, conv)
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

// StoredOutbox returns the outbox rows conv still stores, and the seq of
// the first (0 when st does not compact). The rows are the caller's.
func StoredOutbox(st store.DurableStore, conv participant.ConversationID) ([]outbox.Row, uint64, error) {
	var first uint64
	if cs, ok := store.AsCompactor(st); ok {
		var err error
		if first, err = cs.First(outbox.Stream(conv)); err != nil {
			return nil, 0, err
		}
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

func sameBound(want, got participant.Bound, err error) error {
	var pe *participant.Error
	if errors.As(err, &pe) && pe.Code == participant.CodeReceiptExpired && pe.Reason == "superseded" && pe.Generation > want.Generation {
		return nil
	}
	if err != nil {
		return err
	}
	if got.Participant != want.Participant || got.Generation != want.Generation || got.Secret != want.Secret ||
		got.Cursor != want.Cursor || !got.ReceiptExpiresAt.Equal(want.ReceiptExpiresAt) || got.Replay == participant.ReplayNone {
		return fmt.Errorf("replay = %+v, want %+v marked as a replay", got, want)
	}
	return nil
}

// CheckInvariants opens a service over st, the store a restart after a
// crash finds, and checks the contract (see the package doc): nothing is
// unloadable, reconciliation has nothing to repair, checkpoints are what
// a replay derives, records have no gap or duplicate, bindings end at most
// once, and every operation of log replays its answer. The service is
// closed before it returns.
func CheckInvariants(t faultstore.TB, st store.DurableStore, log []Answered) {
	t.Helper()
	ctx := context.Background()
	svc, err := participant.Open(ctx, st, participant.Options{NodeKey: NodeKey})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	defer svc.Close()
	if unl := svc.Unloadable(); len(unl) != 0 {
		t.Fatalf("a crash made conversations unloadable: %+v", unl)
	}
	// The outbox equals the projection of the oplog byte for byte, and
	// every checkpoint is what a replay from row 0 derives (Inspect
	// rederives while row 0 is stored).
	reports, err := participant.Inspect(st)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	for _, r := range reports {
		if r.Refused != nil || r.Repairs != 0 {
			t.Fatalf("after reconciliation, conversation %v: refused=%+v repairs=%d", r.Conversation, r.Refused, r.Repairs)
		}
		if r.Deleted {
			// The start finished whatever purge the crash cut short.
			CheckPurged(t, st, r.Conversation)
			continue
		}
		rows, first, err := StoredOutbox(st, r.Conversation)
		if err != nil {
			t.Fatalf("outbox of %v: %v", r.Conversation, err)
		}
		CheckRecords(t, rows, first > 0)
	}
	// Every answered operation's retry replays its answer.
	c := svc.Connect(nil)
	for _, a := range log {
		if err := a.Check(ctx, c, st); err != nil {
			t.Fatalf("answered %s: %v", a.What, err)
		}
	}
}

// CheckCompacted fails unless st holds what the completed CutWorkload's
// checkpoint and compaction passes wrote: checkpoints of both
// conversations, and conversation 1's oplog trimmed (everything of it was
// settled, so its retries replayed from receipts).
func CheckCompacted(t faultstore.TB, st store.DurableStore) {
	t.Helper()
	cs, ok := store.AsCompactor(st)
	if !ok {
		t.Fatalf("the store %T does not compact", st)
	}
	for _, id := range []participant.ConversationID{1, 2} {
		if b, err := cs.GetBytes(checkpoint.Key(id)); err != nil || b == nil {
			t.Fatalf("after the completed run, conversation %v has no checkpoint (%v)", id, err)
		}
	}
	if first, err := cs.First(oplog.Stream(1)); err != nil || first == 0 {
		t.Fatalf("after the completed run, conversation 1 was not compacted (first row %d, %v)", first, err)
	}
	CheckPurged(t, st, 3)
}

// CheckPurged fails unless conversation conv of st is deleted and purged:
// its oplog ends with a Delete row and keeps no other, its outbox keeps its
// last row only, and it has no checkpoint and no token index entry.
func CheckPurged(t faultstore.TB, st store.DurableStore, conv participant.ConversationID) {
	t.Helper()
	if deleted, err := Deleted(st, conv); err != nil || !deleted {
		t.Fatalf("conversation %v is not deleted (%v)", conv, err)
	}
	cs, ok := store.AsCompactor(st)
	if !ok {
		t.Fatalf("the store %T does not compact", st)
	}
	for _, stream := range []string{oplog.Stream(conv), outbox.Stream(conv)} {
		n, err := st.Len(stream)
		if err != nil {
			t.Fatalf("length of %s: %v", stream, err)
		}
		if first, err := cs.First(stream); err != nil || first+1 != n {
			t.Fatalf("deleted conversation %v: %s keeps rows %d..%d (%v), want its last only", conv, stream, first, n, err)
		}
	}
	if b, err := cs.GetBytes(checkpoint.Key(conv)); err != nil || b != nil {
		t.Fatalf("deleted conversation %v keeps a checkpoint of %d bytes (%v)", conv, len(b), err)
	}
	if vs, err := st.Scan(tokenindex.ConversationPrefix(conv)); err != nil || len(vs) != 0 {
		t.Fatalf("deleted conversation %v keeps token index entries %v (%v)", conv, vs, err)
	}
}

// CheckRecords checks that record seqs run from 1 (from the first stored,
// when the outbox was compacted) without gap or duplicate, and that each
// binding ends at most once and only after it began (where the compacted
// prefix hides its start, after it was first seen).
func CheckRecords(t faultstore.TB, rows []outbox.Row, compacted bool) {
	t.Helper()
	var next participant.Seq = 1
	bound := map[participant.ParticipantID]bool{}
	seen := map[participant.ParticipantID]bool{}
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
