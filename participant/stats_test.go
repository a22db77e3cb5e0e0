package participant

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

func TestService_Stats_CountsConversationsConnectionsBindings(t *testing.T) {
	ctx := context.Background()
	svc := openService(t, store.NewMemory())
	if diff := cmp.Diff(Stats{}, svc.Stats()); diff != "" {
		t.Errorf("empty service Stats (-want +got):\n%s", diff)
	}
	var w wakeCounter
	a, b := svc.Connect(w.wake), svc.Connect(w.wake)
	for i, c := range []struct {
		conn *Conn
		conv ConversationID
	}{{a, 1}, {a, 2}, {b, 1}} {
		if _, err := c.conn.Enroll(ctx, Enroll{Conversation: c.conv, Token: token(byte(i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	want := Stats{Conversations: 2, Loaded: 2, Connections: 2, Bindings: 3}
	if diff := cmp.Diff(want, svc.Stats()); diff != "" {
		t.Errorf("Stats after three enrolls (-want +got):\n%s", diff)
	}
	if err := a.End(ctx, oplog.CauseClean); err != nil {
		t.Fatal(err)
	}
	want = Stats{Conversations: 2, Loaded: 2, Connections: 1, Bindings: 1}
	if diff := cmp.Diff(want, svc.Stats()); diff != "" {
		t.Errorf("Stats after one connection ended (-want +got):\n%s", diff)
	}
}

// TestService_Lifecycle_CountsWhatThePassesDid runs checkpoint and
// compaction passes by hand on a fake clock and checks every Lifecycle
// figure against what the store holds: the checkpoint's bytes, the rows
// and bytes trimmed, the receipts, the pinned conversation once its
// unacknowledged records are older than Retain, and a failed pass.
func TestService_Lifecycle_CountsWhatThePassesDid(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now, CheckpointInterval: -1})
	must(t, err)
	defer svc.Close()
	if diff := cmp.Diff(Lifecycle{Pinned: -1}, svc.Lifecycle()); diff != "" {
		t.Fatalf("Lifecycle before any pass (-want +got):\n%s", diff)
	}
	h := buildHistory(t, svc, 1, 100, 4)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	ck, err := mem.GetBytes(checkpoint.Key(1))
	must(t, err)
	want := Lifecycle{CheckpointPasses: 1, CheckpointsWritten: 1, CheckpointBytes: uint64(len(ck)), LastCheckpointPass: clk.Now(), Pinned: -1}
	if diff := cmp.Diff(want, svc.Lifecycle()); diff != "" {
		t.Fatalf("Lifecycle after a checkpoint pass (-want +got):\n%s", diff)
	}

	// Within the retention nothing goes, and the unacknowledged tells are
	// too recent to pin anything.
	clk.advance(30 * time.Second)
	_, err = svc.CompactPass(ctx)
	must(t, err)
	want.CompactionPasses, want.LastCompactionPass, want.Pinned = 1, clk.Now(), 0
	if diff := cmp.Diff(want, svc.Lifecycle()); diff != "" {
		t.Fatalf("Lifecycle after a compaction within the retention (-want +got):\n%s", diff)
	}

	rows, err := mem.ReadFrom(oplog.Stream(1), 0, 0)
	must(t, err)
	clk.advance(time.Minute)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	if got.OplogRows == 0 || got.OutboxRows == 0 || got.Receipts == 0 {
		t.Fatalf("CompactPass() after the retention = %+v, want rows of both streams and receipts", got)
	}
	var trimmed uint64
	for _, r := range rows[:got.OplogRows] {
		trimmed += uint64(len(r.Payload))
	}
	want.CompactionPasses, want.LastCompactionPass, want.Pinned = 2, clk.Now(), 1
	want.OplogRowsTrimmed, want.OutboxRowsTrimmed, want.OplogBytesTrimmed = got.OplogRows, got.OutboxRows, trimmed
	want.ReceiptsWritten = uint64(got.Receipts)
	if diff := cmp.Diff(want, svc.Lifecycle()); diff != "" {
		t.Fatalf("Lifecycle after a compaction past the retention (-want +got):\n%s", diff)
	}

	// A store that refuses the checkpoint's write fails the pass, and its
	// conversation's step.
	c := svc.Connect(nil)
	_, err = c.Attach(ctx, Attach{Conversation: 1, Participant: h.sender.Participant, Generation: 1, Secret: h.sender.Secret, Token: token(0x72)})
	must(t, err)
	fs.SetRules(faultstore.OnKind(faultstore.OpPutBytes, faultstore.Fail))
	if _, err := svc.CheckpointPass(ctx); err == nil {
		t.Fatal("CheckpointPass() with PutBytes failing = nil, want an error")
	}
	want.CheckpointPasses, want.CheckpointPassesFailed = 2, 1
	want.ConversationFailures[StepCheckpoint] = 1
	if diff := cmp.Diff(want, svc.Lifecycle()); diff != "" {
		t.Fatalf("Lifecycle after a failed checkpoint pass (-want +got):\n%s", diff)
	}
}
