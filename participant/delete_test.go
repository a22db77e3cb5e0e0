package participant

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// wantRetired fails unless err is the retired refusal.
func wantRetired(t *testing.T, what string, err error) {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeRetired {
		t.Errorf("%s = %v, want retired", what, err)
	}
}

// TestDelete_EveryParticipantLeftGoesAfterRetention (security item 6d): a
// conversation whose participants all left is deleted by the compaction
// pass once its last row is older than the retention, and not before; a
// conversation with a member who has not left never is. Deleted, it frees
// its slot of MaxConversations and its memory, answers every operation
// (a retry of a committed token, an attach, an enroll into its id)
// retired, keeps no token index entry, receipt or checkpoint and only the
// last row of each stream, and stays so across a restart, where it counts
// against no cap.
func TestDelete_EveryParticipantLeftGoesAfterRetention(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now, MaxConversations: 3}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	ca, cb := svc.Connect(nil), svc.Connect(nil)
	a := mustEnroll(t, ca, 1, 1)
	b := mustEnroll(t, cb, 1, 2)
	told, err := ca.Tell(ctx, Tell{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Token: token(3), Payload: []byte("x")})
	must(t, err)
	_, err = cb.Ack(ctx, Ack{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Through: told.Seq})
	must(t, err)
	live := mustEnroll(t, svc.Connect(nil), 2, 4) // conversation 2 keeps a member
	// Compact conversation 1's history first, so that it has receipts.
	clk.advance(2 * time.Minute)
	if _, err := svc.CheckpointPass(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := svc.CompactPass(ctx); err != nil || got.Receipts == 0 || got.Deleted != 0 {
		t.Fatalf("CompactPass = %+v, %v; want receipts written and nothing deleted", got, err)
	}
	leaveA := Leave{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret, Token: token(5)}
	_, err = ca.Leave(ctx, leaveA)
	must(t, err)
	_, err = cb.Leave(ctx, Leave{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: token(6)})
	must(t, err)

	clk.advance(30 * time.Second) // within the retention of the last leave
	if _, err := svc.CheckpointPass(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := svc.CompactPass(ctx); err != nil || got.Deleted != 0 {
		t.Fatalf("CompactPass within the retention = %+v, %v; want nothing deleted", got, err)
	}
	if r, err := ca.Leave(ctx, leaveA); err != nil || r.Replay != ReplayCommitted {
		t.Fatalf("retried leave before the deletion = %+v, %v; want its replay", r, err)
	}
	oplogLen, err := mem.Len(oplog.Stream(1))
	must(t, err)

	clk.advance(time.Minute)
	got, err := svc.CompactPass(ctx)
	if err != nil || got.Deleted != 1 {
		t.Fatalf("CompactPass after the retention = %+v, %v; want conversation 1 deleted", got, err)
	}
	if svc.existing(1) != nil {
		t.Errorf("the deleted conversation is still in memory")
	}
	if svc.existing(2) == nil {
		t.Errorf("conversation 2, whose member has not left, is gone")
	}
	checkPurged(t, mem, 1, oplogLen)

	// Every operation on it is retired; nothing of it comes back.
	_, err = ca.Leave(ctx, leaveA)
	wantRetired(t, "retried leave", err)
	_, err = ca.Attach(ctx, Attach{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret, Token: token(7)})
	wantRetired(t, "attach", err)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(8)})
	wantRetired(t, "enroll into the deleted id", err)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(1)})
	wantRetired(t, "retried first enroll", err)
	if svc.existing(1) != nil {
		t.Errorf("operations on the deleted conversation left an entry in memory")
	}
	if n, err := mem.Len(oplog.Stream(1)); err != nil || n != oplogLen+1 {
		t.Errorf("the oplog has %d rows (%v), want %d: the refusals wrote", n, err, oplogLen+1)
	}

	// Its slot is free: with conversation 2, two more fit under the cap
	// of three, and no third.
	mustEnroll(t, svc.Connect(nil), 3, 9)
	mustEnroll(t, svc.Connect(nil), 4, 10)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 5, Token: token(11)})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded {
		t.Errorf("a fourth conversation = %v, want capacity_exceeded", err)
	}
	svc.Close()

	svc, err = Open(ctx, mem, opts)
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(12)})
	wantRetired(t, "enroll into the deleted id after a restart", err)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 5, Token: token(13)})
	if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded {
		t.Errorf("a fourth conversation after a restart = %v, want capacity_exceeded: the deleted one counts", err)
	}
	if _, err := svc.Connect(nil).Attach(ctx, Attach{Conversation: 2, Participant: live.Participant, Generation: live.Generation, Secret: live.Secret, Token: token(14)}); err != nil {
		t.Errorf("attach in conversation 2 after a restart = %v", err)
	}
	reports, err := Inspect(mem)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reports {
		if r.Refused != nil || r.Deleted != (r.Conversation == 1) {
			t.Errorf("Inspect: %+v; want conversation 1 deleted, none refused", r)
		}
	}
}

// checkPurged fails unless deleted conversation c keeps only its Delete
// row (oplog row at) and its outbox's last row, and no token index entry,
// receipt or checkpoint.
func checkPurged(t *testing.T, mem *store.Memory, c ConversationID, at uint64) {
	t.Helper()
	if first := firstOf(t, mem, oplog.Stream(c)); first != at {
		t.Errorf("the deleted conversation's oplog starts at %d, want its Delete row %d", first, at)
	}
	n, err := mem.Len(outbox.Stream(c))
	must(t, err)
	if first := firstOf(t, mem, outbox.Stream(c)); first+1 != n {
		t.Errorf("the deleted conversation's outbox keeps rows %d..%d, want its last", first, n)
	}
	if vs, err := mem.Scan(tokenindex.ConversationPrefix(c)); err != nil || len(vs) != 0 {
		t.Errorf("token index entries left: %v (%v)", vs, err)
	}
	if b, err := mem.GetBytes(checkpoint.Key(c)); err != nil || b != nil {
		t.Errorf("checkpoint left: %d bytes (%v)", len(b), err)
	}
	for i := range at {
		for _, k := range []string{receipt.Key(c, i), receipt.KeyV1(c, i)} {
			if b, err := mem.GetBytes(k); err != nil || b != nil {
				t.Fatalf("receipt %s left: %d bytes (%v)", k, len(b), err)
			}
		}
	}
}

// TestDelete_RefusedWhileAMemberStays: a member enrolling between the
// pass's look and its turn keeps the conversation; so does a record still
// retained, and a conversation nobody ever joined is not deletable.
func TestDelete_RefusedWhileAMemberStays(t *testing.T) {
	st := &outbox.State{}
	if deletable(st) {
		t.Errorf("a conversation without members is deletable")
	}
	st.Members = []outbox.Member{{Retired: true}, {Retired: false}}
	if deletable(st) {
		t.Errorf("a conversation with a member who has not left is deletable")
	}
	st.Members[1].Retired = true
	if !deletable(st) {
		t.Errorf("a conversation every member left is not deletable")
	}
	st.Retain(outbox.Record{Seq: st.LastSeq + 1, Kind: outbox.KindRecord}, 0)
	if deletable(st) {
		t.Errorf("a conversation that retains a record is deletable")
	}
}

// TestDelete_AFailingConversationDoesNotStopThePass: a transient failure of
// one conversation's deletion (its last row unreadable; another's purge
// failing after its Delete row committed) fails neither the deletion of
// the others in the same pass nor its own in the next: the pass deletes
// every other conversation, reports the failures, and the next pass
// deletes the first and finishes the second's purge, although nothing
// touched either in between. The compaction of the other conversations
// runs in the failing pass as in any other.
func TestDelete_AFailingConversationDoesNotStopThePass(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	// Conversation 20 keeps its members and has rows to compact: the
	// compaction part of the pass runs too.
	buildHistory(t, svc, 20, 10, 0)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	const convs = 16
	const unreadable, unpurged = ConversationID(3), ConversationID(5)
	at := make(map[ConversationID]uint64)
	for c := ConversationID(1); c <= convs; c++ {
		conn := svc.Connect(nil)
		b := mustEnroll(t, conn, c, byte(c))
		_, err := conn.Leave(ctx, Leave{Conversation: c, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: token(byte(100 + c))})
		must(t, err)
		n, err := mem.Len(oplog.Stream(c))
		must(t, err)
		at[c] = n
	}
	clk.advance(2 * time.Minute)
	fs.SetRules(
		faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpRead), faultstore.Name(oplog.Stream(unreadable))),
		faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpScan), faultstore.Name(tokenindex.ConversationPrefix(unpurged))),
	)
	got, err := svc.CompactPass(ctx)
	if !errors.Is(err, faultstore.ErrInjected) || got.Deleted != convs-1 || got.Conversations != 1 {
		t.Fatalf("CompactPass with two conversations failing = %+v, %v; want the other %d deleted (and %d's Delete row committed), conversation 20 compacted, and the faults reported", got, err, convs-2, unpurged)
	}
	for c := ConversationID(1); c <= convs; c++ {
		if c != unreadable && c != unpurged {
			checkPurged(t, mem, c, at[c])
		}
	}
	if n, err := mem.Len(oplog.Stream(unreadable)); err != nil || n != at[unreadable] {
		t.Errorf("conversation %d's oplog has %d rows (%v), want %d: not deleted while its last row is unreadable", unreadable, n, err, at[unreadable])
	}

	// The failed purge's conversation was dropped and reloaded in the
	// background, which failed the same way: nothing but the next pass
	// finishes it.
	svc.waitReloads()
	fs.SetRules()
	got, err = svc.CompactPass(ctx)
	if err != nil || got.Deleted != 1 {
		t.Fatalf("the next CompactPass = %+v, %v; want conversation %d deleted", got, err, unreadable)
	}
	checkPurged(t, mem, unreadable, at[unreadable])
	checkPurged(t, mem, unpurged, at[unpurged])
	for _, c := range []ConversationID{unreadable, unpurged} {
		if svc.existing(c) != nil {
			t.Errorf("deleted conversation %d is still in memory", c)
		}
	}
}
