package participant

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
)

// seqToken is the n-th token of a test, distinct from the byte tokens of
// token().
func seqToken(n uint64, tag byte) Token {
	var t Token
	binary.BigEndian.PutUint64(t[:], n)
	t[14], t[15] = tag, 0x5a
	return t
}

// wantBacklogFull fails unless err is backlog_full with limit.
func wantBacklogFull(t *testing.T, what string, err error, limit uint64) {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeBacklogFull || !errors.Is(err, ErrBacklogFull) {
		t.Fatalf("%s = %v, want backlog_full", what, err)
	}
	if pe.Limit != limit {
		t.Errorf("%s: backlog_full with limit %d, want %d", what, pe.Limit, limit)
	}
}

// TestBacklogFull_ConversationLimitRefusesUntilTheDeafMemberAcks: one
// member never acknowledges, so every tell is retained. Past
// MaxBacklogRecords, tell and enroll are refused backlog_full before
// anything is written; ack, a connection's end and the deaf member's own
// re-attachment still commit; once it acknowledges, the refused tell,
// retried with the same token, commits exactly once.
func TestBacklogFull_ConversationLimitRefusesUntilTheDeafMemberAcks(t *testing.T) {
	const limit = 40
	st := store.NewMemory()
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, MaxBacklogRecords: limit})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	rx := mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	tell := func(n uint64) (Told, error) {
		return sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation, Token: seqToken(n, 1), Payload: nil})
	}
	// The sender's joined record is addressed to the deaf member: it is
	// the first retained record.
	var n uint64
	for ; ; n++ {
		if _, err := tell(n); err != nil {
			wantBacklogFull(t, "Tell past the conversation's limit", err, limit)
			break
		}
		if n > 10*limit {
			t.Fatalf("%d tells committed to a member that never acks, past a limit of %d", n, limit)
		}
	}
	if got := svc.Backlog().Records; got != limit {
		t.Errorf("Backlog().Records when refused = %d, want the limit %d", got, limit)
	}
	refused := n
	// A refusal changes nothing durable.
	before := oplogLen(t, st, 1)
	if _, err := tell(refused); err == nil {
		t.Fatal("retried refused Tell committed while the backlog is still full")
	}
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(3)}); err == nil {
		t.Fatal("Enroll into a full conversation committed")
	} else {
		wantBacklogFull(t, "Enroll into a full conversation", err, limit)
	}
	if after := oplogLen(t, st, 1); after != before {
		t.Fatalf("refused operations grew the oplog from %d to %d rows", before, after)
	}
	if bl := svc.Backlog(); bl.ConversationRefusals != 3 || bl.ServerRefusals != 0 {
		t.Errorf("Backlog() refusals = %d conversation, %d server; want 3, 0", bl.ConversationRefusals, bl.ServerRefusals)
	}

	// The deaf member's connection is lost (never refused, past the
	// limit), and it re-attaches: that attach is how its records reach it,
	// so it is admitted although the conversation is full.
	must(t, deaf.End(ctx, oplog.CauseConnectionLost))
	back := svc.Connect(nil)
	rx2, err := back.Attach(ctx, Attach{Conversation: 1, Participant: rx.Participant, Generation: rx.Generation, Secret: rx.Secret, Token: token(4)})
	if err != nil {
		t.Fatalf("Attach of the member the backlog waits for = %v, want ok", err)
	}
	// The sender, with nothing of the backlog to receive, is not: its
	// re-attachment would only add records.
	if _, err := tell(refused); err == nil {
		t.Fatal("refused Tell committed before the member acknowledged")
	}
	ds := drainNext(back, 1)
	if len(ds) == 0 {
		t.Fatal("the re-attached member was offered nothing")
	}
	if _, err := back.Ack(ctx, Ack{Conversation: 1, Participant: rx.Participant, Generation: rx2.Generation, Through: ds[len(ds)-1].Seq}); err != nil {
		t.Fatalf("Ack at a full backlog = %v, want ok", err)
	}
	// What is left are the member's died and attached records, which the
	// sender has yet to acknowledge.
	if got := svc.Backlog().Records; got > 2 {
		t.Errorf("Backlog().Records after the member acknowledged everything = %d, want at most 2", got)
	}
	told, err := tell(refused)
	if err != nil {
		t.Fatalf("Tell retried with its token after the backlog drained = %v, want ok", err)
	}
	if told.Replay != ReplayNone {
		t.Errorf("first commit of the refused tell answered as a replay %q", told.Replay)
	}
	again, err := tell(refused)
	if err != nil {
		t.Fatalf("second retry of the same token = %v, want its replay", err)
	}
	if diff := cmp.Diff(Told{Conversation: 1, Seq: told.Seq, Replay: ReplayCommitted}, again); diff != "" {
		t.Errorf("replay of the retried tell differs (-want +got):\n%s", diff)
	}
	// Exactly one record of that token was committed: the next tell
	// follows it directly.
	next, err := tell(refused + 1)
	must(t, err)
	if next.Seq != told.Seq+1 {
		t.Errorf("tell after the retried one has seq %v, want %v (the retry committed more than once?)", next.Seq, told.Seq+1)
	}
}

// TestBacklogFull_ReplayComesBeforeTheCheck: a token that committed
// replays its answer even while the conversation is full.
func TestBacklogFull_ReplayComesBeforeTheCheck(t *testing.T) {
	const limit = 10
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, MaxBacklogRecords: limit})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	req := Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation, Token: seqToken(0, 2)}
	first, err := sender.Tell(ctx, req)
	must(t, err)
	for n := uint64(1); ; n++ {
		r := req
		r.Token = seqToken(n, 2)
		if _, err := sender.Tell(ctx, r); err != nil {
			wantBacklogFull(t, "Tell past the limit", err, limit)
			break
		}
		if n > 10*limit {
			t.Fatalf("%d tells committed to a member that never acks, past a limit of %d", n, limit)
		}
	}
	got, err := sender.Tell(ctx, req)
	if err != nil {
		t.Fatalf("replay of a committed tell at a full backlog = %v, want its answer", err)
	}
	if got.Seq != first.Seq || got.Replay != ReplayCommitted {
		t.Errorf("replay = %+v, want seq %v replayed", got, first.Seq)
	}
}

// TestBacklogFull_ServerBudgetRefusesOnlyTheConversationsHoldingIt: with a
// service-wide budget and no practical per-conversation limit, a
// conversation behind a deaf member fills the budget and is refused; a
// conversation whose recipient acknowledges every record keeps committing;
// a second deaf conversation gets at most its share before it is refused
// too, and the total stays within the hard ceiling.
func TestBacklogFull_ServerBudgetRefusesOnlyTheConversationsHoldingIt(t *testing.T) {
	const budget = 120
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, MaxBacklogRecords: 100 * budget, BacklogRecords: budget})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	type pair struct {
		rx, tx     *Conn
		rxB, txB   Bound
		conv       ConversationID
		committed  int
		tokenCount uint64
	}
	newPair := func(conv ConversationID) *pair {
		p := &pair{rx: svc.Connect(nil), tx: svc.Connect(nil), conv: conv}
		p.rxB = mustEnroll(t, p.rx, conv, byte(2*conv))
		p.txB = mustEnroll(t, p.tx, conv, byte(2*conv+1))
		return p
	}
	tell := func(p *pair) error {
		p.tokenCount++
		_, err := p.tx.Tell(ctx, Tell{Conversation: p.conv, Participant: p.txB.Participant, Generation: p.txB.Generation, Token: seqToken(p.tokenCount, byte(p.conv))})
		if err == nil {
			p.committed++
		}
		return err
	}
	fill := func(p *pair) {
		t.Helper()
		for {
			err := tell(p)
			if err != nil {
				wantBacklogFull(t, "Tell of a deaf conversation past the budget", err, budget)
				return
			}
			if p.committed > 10*budget {
				t.Fatalf("conversation %v committed %d tells to a deaf member, past a budget of %d", p.conv, p.committed, budget)
			}
		}
	}
	deaf1 := newPair(1)
	fill(deaf1)
	if got := svc.Backlog().Records; got != budget {
		t.Errorf("Backlog().Records when the first deaf conversation is refused = %d, want the budget %d", got, budget)
	}
	healthy := newPair(2)
	deaf2 := newPair(3)
	fill(deaf2)
	if deaf2.committed >= deaf1.committed {
		t.Errorf("second deaf conversation committed %d tells, the first %d: want less than the first (its share past the budget)", deaf2.committed, deaf1.committed)
	}
	for i := range 3 * budget {
		if err := tell(healthy); err != nil {
			t.Fatalf("tell %d of a conversation whose recipient acknowledges = %v, want ok", i, err)
		}
		ds := drainNext(healthy.rx, healthy.conv)
		if _, err := healthy.rx.Ack(ctx, Ack{Conversation: healthy.conv, Participant: healthy.rxB.Participant, Generation: healthy.rxB.Generation, Through: ds[len(ds)-1].Seq}); err != nil {
			t.Fatalf("Ack: %v", err)
		}
		if i%budget == 0 {
			// The deaf conversations stay refused meanwhile.
			if err := tell(deaf1); err == nil {
				t.Fatal("the first deaf conversation committed while the budget is spent")
			}
		}
	}
	bl := svc.Backlog()
	if ceiling := int64(budget + budget/4); bl.Records > ceiling {
		t.Errorf("Backlog().Records = %d, want at most the hard ceiling %d", bl.Records, ceiling)
	}
	if bl.ServerRefusals == 0 || bl.ConversationRefusals != 0 {
		t.Errorf("Backlog() refusals = %d conversation, %d server; want only server ones", bl.ConversationRefusals, bl.ServerRefusals)
	}
}

// TestBacklogFull_RetainedRecordsOfZeroByteTellsStayWithinTheLimit sends
// many zero-byte tells (pipelined, as a client that does not wait would)
// to a member that never acknowledges: the retained records, and the heap,
// stay at the limit's worth instead of growing with the tells. It logs
// the heap cost of one retained record (BENCHMARKS.md).
func TestBacklogFull_RetainedRecordsOfZeroByteTellsStayWithinTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 200,000 tells")
	}
	const (
		limit  = 20_000
		tells  = 200_000
		window = 256
	)
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{})
	must(t, err)
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, MaxBacklogRecords: limit})
	must(t, err)
	t.Cleanup(func() {
		svc.Close()
		st.Close()
	})
	ctx := context.Background()
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	send := func(from, to int) (committed int) {
		calls := make([]*Call[Told], 0, window)
		for i := from; i < to; i++ {
			calls = append(calls, sender.StartTell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation, Token: seqToken(uint64(i), 3)}))
			if len(calls) == window || i == to-1 {
				for _, c := range calls {
					switch _, err := c.Wait(); {
					case err == nil:
						committed++
					case errors.Is(err, ErrBacklogFull):
					default:
						t.Fatalf("Tell: %v", err)
					}
				}
				calls = calls[:0]
			}
		}
		return committed
	}
	// A conversation of one member, whose records are addressed to nobody:
	// its commits empty the store's cache of values read since the last
	// commit (the token lookups of refused tells, bounded by the store),
	// so that the heap is measured without it.
	alone := svc.Connect(nil)
	solo := mustEnroll(t, alone, 2, 3)
	settle := func(n uint64) {
		_, err := alone.Tell(ctx, Tell{Conversation: 2, Participant: solo.Participant, Generation: solo.Generation, Token: seqToken(n, 4)})
		must(t, err)
	}
	send(0, 1000) // warm up: lazily built structures are not counted
	settle(0)
	before := heapInUse()
	recBefore := svc.Backlog().Records
	committed := send(1000, limit)
	settle(1)
	mid := heapInUse()
	recMid := svc.Backlog().Records
	committed += send(limit, tells)
	settle(2)
	after := heapInUse()
	bl := svc.Backlog()
	if bl.Records != limit {
		t.Errorf("Backlog().Records after %d zero-byte tells to a deaf member = %d, want the limit %d", tells, bl.Records, limit)
	}
	grown := int64(after) - int64(before)
	t.Logf("%d tells, %d committed, %d refused; %d records retained",
		tells, committed+1000, tells-1000-committed, bl.Records)
	t.Logf("heap: %.0f bytes per retained record (%d records: %.2f MiB); the refusals after them: %.2f MiB (the store's cache of token lookups); in all %.2f MiB",
		float64(int64(mid)-int64(before))/float64(recMid-recBefore), recMid-recBefore, float64(int64(mid)-int64(before))/(1<<20),
		float64(int64(after)-int64(mid))/(1<<20), float64(grown)/(1<<20))
	// A record is a 16-byte slot and its share of the array it grows in:
	// one sender's tells are one run (outbox.Retention). It was 60 bytes
	// with a 48-byte outbox.Retained each, 115 before that.
	if per := float64(int64(mid)-int64(before)) / float64(recMid-recBefore); per > 40 {
		t.Errorf("a retained record costs %.0f bytes of heap, want at most 40", per)
	}
	// Unbounded, the 200,000 records cost some 25 MiB; bounded, 20,000
	// cost a tenth of it. The bound leaves room for noise.
	const bound = 8 << 20
	if grown > bound {
		t.Errorf("%d zero-byte tells to a deaf member grew the heap by %.1f MiB, want < %d MiB",
			tells, float64(grown)/(1<<20), bound>>20)
	}
}

// TestBacklogLimits_Admit pins the admission rule of backpressure.go.
func TestBacklogLimits_Admit(t *testing.T) {
	l := backlogLimits{conversation: 80, budget: 400} // ceilings 90 and 500
	for _, tc := range []struct {
		name         string
		held, total  int64
		catchUp      bool
		wantScope    string
		wantLimitVal uint64
	}{
		{"below every limit", 10, 100, false, "", 0},
		{"at the conversation's limit", 80, 100, false, backlogScopeConversation, 80},
		{"a waiting member's attach past it", 85, 100, true, "", 0},
		{"a waiting member's attach at its ceiling", 90, 100, true, backlogScopeConversation, 80},
		{"past the budget, a small holder", 10, 420, false, "", 0},
		{"past the budget, half the headroom or more", 40, 420, false, backlogScopeServer, 400},
		{"past the budget, just under half the headroom", 39, 420, false, "", 0},
		{"past the budget, a waiting member's attach", 79, 420, true, "", 0},
		{"at the server's ceiling, an empty conversation", 0, 500, false, backlogScopeServer, 400},
		{"at the server's ceiling, a waiting member's attach", 5, 500, true, backlogScopeServer, 400},
	} {
		e, scope := l.admit(tc.held, tc.total, tc.catchUp)
		var limit uint64
		if e != nil {
			limit = e.Limit
			if e.Code != CodeBacklogFull {
				t.Errorf("%s: admit = %v, want backlog_full", tc.name, e)
			}
		}
		if scope != tc.wantScope || limit != tc.wantLimitVal {
			t.Errorf("%s: admit(held %d, total %d, catch-up %v) = scope %q limit %d, want %q %d",
				tc.name, tc.held, tc.total, tc.catchUp, scope, limit, tc.wantScope, tc.wantLimitVal)
		}
	}
}

// TestBacklogFull_RefusedFirstEnrollGivesBackItsSlots: the first enroll of
// a new conversation refused at the server's ceiling takes neither a
// conversation slot (MaxConversations) nor a binding slot of its
// connection: retried once the backlog drained, it commits.
func TestBacklogFull_RefusedFirstEnrollGivesBackItsSlots(t *testing.T) {
	const budget = 40
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, BacklogRecords: budget, MaxConversations: 2, MaxConversationsPerConn: 1})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	rx := mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	// Tells stop at the budget: conversation 1 then retains more than
	// half of the headroom.
	for n := uint64(0); ; n++ {
		if _, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation, Token: seqToken(n, 5)}); err != nil {
			wantBacklogFull(t, "Tell past the budget", err, budget)
			break
		}
	}
	// Fill to the ceiling with waiting members' attaches, admitted past the
	// budget: each one supersedes the previous binding (two records).
	back := svc.Connect(nil)
	cur := rx
	for i := byte(0); svc.Backlog().Records < budget+budget/4; i++ {
		b, err := back.Attach(ctx, Attach{Conversation: 1, Participant: rx.Participant, Generation: cur.Generation, Secret: cur.Secret, Token: token(100 + i)})
		if err != nil {
			wantBacklogFull(t, "a waiting member's attach at the ceiling", err, budget)
			break
		}
		cur = b
	}
	newcomer := svc.Connect(nil)
	req := Enroll{Conversation: 2, Token: token(7)}
	if _, err := newcomer.Enroll(ctx, req); err == nil {
		t.Fatal("Enroll into a new conversation at the server's ceiling committed")
	} else {
		wantBacklogFull(t, "Enroll into a new conversation at the ceiling", err, budget)
	}
	ds := drainNext(back, 1)
	if _, err := back.Ack(ctx, Ack{Conversation: 1, Participant: rx.Participant, Generation: cur.Generation, Through: ds[len(ds)-1].Seq}); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if _, err := newcomer.Enroll(ctx, req); err != nil {
		t.Fatalf("Enroll retried after the backlog drained = %v, want ok (a slot leaked?)", err)
	}
}
