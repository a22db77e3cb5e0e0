package participant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	// +checklocks:mu
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func firstOf(t *testing.T, mem *store.Memory, stream string) uint64 {
	t.Helper()
	first, err := mem.First(stream)
	must(t, err)
	return first
}

// TestCompaction_RemovesSettledHistoryOnlyAfterRetain builds acknowledged
// history, checkpoints it, and compacts before and after the retention:
// nothing goes before it, the settled prefix goes after it, unacknowledged
// records stay deliverable, and every committed token still replays its
// original answer (a tell with another payload is still token_conflict),
// before and after a restart.
func TestCompaction_RemovesSettledHistoryOnlyAfterRetain(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	h := buildHistory(t, svc, 1, 100, 4)
	total := oplogLen(t, mem, 1)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	clk.advance(30 * time.Second)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	if got.Conversations != 0 || firstOf(t, mem, oplog.Stream(1)) != 0 {
		t.Fatalf("CompactPass() before the retention = %+v, want nothing removed", got)
	}
	clk.advance(time.Minute)
	got, err = svc.CompactPass(ctx)
	must(t, err)
	opFirst, obFirst := firstOf(t, mem, oplog.Stream(1)), firstOf(t, mem, outbox.Stream(1))
	// The four unacknowledged tells are the last rows but a few: everything
	// before the first of them goes.
	if opFirst < total-10 || obFirst == 0 || got.OplogRows != opFirst || got.Receipts == 0 {
		t.Fatalf("CompactPass() after the retention = %+v, oplog first %d of %d, outbox first %d", got, opFirst, total, obFirst)
	}
	checkReplays := func(svc *Service) {
		t.Helper()
		c := svc.Connect(nil)
		for i := range 100 {
			req := Tell{Conversation: 1, Participant: h.sender.Participant, Generation: 1,
				Token: benchToken(1, uint64(i)), Payload: []byte(fmt.Sprintf("tell %d of %v", i, ConversationID(1)))}
			told, err := c.Tell(ctx, req)
			if err != nil || told.Replay != ReplayCommitted || told.Seq != Seq(3+i) {
				t.Fatalf("retry of tell %d after compaction = %+v, %v, want seq %d replayed", i, told, err, 3+i)
			}
			req.Payload = []byte("something else")
			_, err = c.Tell(ctx, req)
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeTokenConflict {
				t.Fatalf("retry of tell %d with another payload = %v, want token_conflict", i, err)
			}
		}
		b, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)})
		if err != nil || b.Participant != h.sender.Participant || b.Secret != h.sender.Secret || b.Replay == ReplayNone {
			t.Fatalf("retry of the first enroll after compaction = %+v, %v, want its original answer", b, err)
		}
	}
	checkReplays(svc)
	must(t, svc.Close())

	// A restart reconciles from the checkpoint and still offers the reader
	// what it did not acknowledge.
	svc, err = Open(ctx, mem, opts)
	must(t, err)
	defer svc.Close()
	if unl := svc.Unloadable(); len(unl) != 0 {
		t.Fatalf("Unloadable() after compaction = %+v", unl)
	}
	checkReplays(svc)
	cr := svc.Connect(nil)
	_, err = cr.Attach(ctx, Attach{Conversation: 1, Participant: h.reader.Participant, Generation: 1, Secret: h.reader.Secret, Token: token(0x70)})
	must(t, err)
	var pending []string
	for _, d := range drainNext(cr, 1) {
		if d.Kind == outbox.KindRecord {
			pending = append(pending, string(d.Payload))
		}
	}
	if diff := cmp.Diff(h.pending, pending); diff != "" {
		t.Fatalf("records offered after compaction and a restart (-want +got):\n%s", diff)
	}
	reports, err := Inspect(mem)
	must(t, err)
	if len(reports) != 1 || reports[0].Refused != nil {
		t.Fatalf("Inspect after compaction = %+v, want conversation 1 served", reports)
	}
}

// TestCompaction_AMemberThatNeverAcksPinsItsRecords keeps one member from
// acknowledging: its first unacknowledged record and everything after
// stay, however old.
func TestCompaction_AMemberThatNeverAcksPinsItsRecords(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now})
	must(t, err)
	defer svc.Close()
	h := buildHistory(t, svc, 1, 30, 0)
	// A third member enrolls and never acknowledges anything after it.
	c := svc.Connect(nil)
	mustEnroll(t, c, 1, 3)
	pinned := oplogLen(t, mem, 1)
	cs := svc.Connect(nil)
	sender, err := cs.Attach(ctx, Attach{Conversation: 1, Participant: h.sender.Participant, Generation: 1, Secret: h.sender.Secret, Token: token(0x71)})
	must(t, err)
	for i := range 5 {
		_, err := cs.Tell(ctx, Tell{Conversation: 1, Participant: sender.Participant, Generation: sender.Generation, Token: benchToken(7, uint64(i)), Payload: []byte("x")})
		must(t, err)
	}
	_, err = svc.CheckpointPass(ctx)
	must(t, err)
	clk.advance(24 * time.Hour)
	_, err = svc.CompactPass(ctx)
	must(t, err)
	if first := firstOf(t, mem, oplog.Stream(1)); first == 0 || first > pinned {
		t.Fatalf("oplog first row after compaction = %d, want in (0, %d]: the unacknowledged records pin the rest", first, pinned)
	}
}

// TestCompaction_TrimsLongHistoriesInSteps compacts more rows than one
// step of the turn trims: every step lands, and the oldest and newest
// compacted tokens still replay, before and after a restart.
func TestCompaction_TrimsLongHistoriesInSteps(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	const tells = 2 * trimStep
	h := buildHistory(t, svc, 1, tells, 1)
	_, err = svc.CheckpointPass(ctx)
	must(t, err)
	clk.advance(2 * time.Minute)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	if got.OplogRows <= 2*trimStep || firstOf(t, mem, oplog.Stream(1)) != got.OplogRows {
		t.Fatalf("CompactPass() = %+v, oplog first %d: want more than two steps trimmed", got, firstOf(t, mem, oplog.Stream(1)))
	}
	must(t, svc.Close())
	svc, err = Open(ctx, mem, opts)
	must(t, err)
	defer svc.Close()
	c := svc.Connect(nil)
	for _, i := range []int{0, tells / 2, tells - 2} {
		told, err := c.Tell(ctx, Tell{Conversation: 1, Participant: h.sender.Participant, Generation: 1,
			Token: benchToken(1, uint64(i)), Payload: []byte(fmt.Sprintf("tell %d of %v", i, ConversationID(1)))})
		if err != nil || told.Replay != ReplayCommitted || told.Seq != Seq(3+i) {
			t.Fatalf("retry of tell %d after compaction in steps = %+v, %v, want seq %d replayed", i, told, err, 3+i)
		}
	}
}

// resettingStore loses the receipts written for a conversation and tells
// the service its state was reset, as a cluster node's store does when the
// conversation's ownership is lost and regained between a compaction's
// receipts and its trims (the scope's staged writes are discarded).
type resettingStore struct {
	*store.Memory
	svc  *Service
	lost bool
}

func (r *resettingStore) PutBytes(values []store.Bytes) error {
	if len(values) > 0 && strings.HasPrefix(values[0].Key, "receipt/") && !r.lost {
		r.lost = true
		r.svc.Forget(1)
		return nil
	}
	return r.Memory.PutBytes(values)
}

// TestCompaction_AResetBetweenReceiptsAndTrimsTrimsNothing: receipts that a
// reset discarded are never relied on: the trims of that pass do not run,
// every token still replays, and the next pass compacts.
func TestCompaction_AResetBetweenReceiptsAndTrimsTrimsNothing(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	rs := &resettingStore{Memory: store.NewMemory()}
	svc, err := Open(ctx, rs, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now})
	must(t, err)
	rs.svc = svc
	buildHistory(t, svc, 1, 50, 4)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	clk.advance(2 * time.Minute)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	if !rs.lost {
		t.Fatal("the pass wrote no receipts: the test did not reset anything")
	}
	if first := firstOf(t, rs.Memory, oplog.Stream(1)); first != 0 || got.Conversations != 0 {
		t.Fatalf("CompactPass() after a reset lost its receipts = %+v, oplog first %d; want nothing trimmed", got, first)
	}
	// Served again (reconciled), the next pass writes the receipts anew and
	// compacts; every token still replays from them.
	c := svc.Connect(nil)
	if _, err := c.Tell(ctx, Tell{Conversation: 1, Participant: 0, Generation: 1, Token: benchToken(1, 0),
		Payload: []byte(fmt.Sprintf("tell %d of %v", 0, ConversationID(1)))}); err != nil {
		t.Fatalf("retry of tell 0 after the reset: %v", err)
	}
	got, err = svc.CompactPass(ctx)
	must(t, err)
	if first := firstOf(t, rs.Memory, oplog.Stream(1)); first == 0 || got.Receipts == 0 {
		t.Fatalf("the pass after the reset = %+v, oplog first %d; want receipts written and rows trimmed", got, first)
	}
	told, err := c.Tell(ctx, Tell{Conversation: 1, Participant: 0, Generation: 1, Token: benchToken(1, 0),
		Payload: []byte(fmt.Sprintf("tell %d of %v", 0, ConversationID(1)))})
	if err != nil || told.Replay != ReplayCommitted {
		t.Fatalf("retry of tell 0 after compaction = %+v, %v, want a replay", told, err)
	}
}

// TestCompactPass_AFailedCheckpointReadFailsThePass: a store that fails
// to read a conversation's checkpoint fails the pass, which trims nothing
// of it, rather than passing over it as if it had no checkpoint; the next
// pass compacts it.
func TestCompactPass_AFailedCheckpointReadFailsThePass(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now})
	must(t, err)
	defer svc.Close()
	buildHistory(t, svc, 1, 10, 0)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	clk.advance(2 * time.Minute)
	fs.SetRules(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpRead), faultstore.Name(checkpoint.Key(1))))
	got, err := svc.CompactPass(ctx)
	if !errors.Is(err, faultstore.ErrInjected) || got.Conversations != 0 || firstOf(t, mem, oplog.Stream(1)) != 0 {
		t.Fatalf("CompactPass() with the checkpoint unreadable = %+v, %v; want the read's failure and nothing trimmed", got, err)
	}
	fs.SetRules()
	if got, err := svc.CompactPass(ctx); err != nil || got.Conversations != 1 {
		t.Fatalf("CompactPass() once the checkpoint reads = %+v, %v; want the conversation compacted", got, err)
	}
}
