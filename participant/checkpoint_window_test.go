package participant

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// replayState is conversation c's state as a replay from row 0 builds it,
// with its checkpoint set aside for the replay and put back after.
func replayState(t *testing.T, mem *store.Memory, c ConversationID, p pages) *Reconciled {
	t.Helper()
	ck, err := mem.GetBytes(checkpoint.Key(c))
	must(t, err)
	must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(c), Value: nil}}))
	r, err := reconcile(context.Background(), mem, c, p)
	must(t, err)
	must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(c), Value: ck}}))
	return r
}

// tellAgain attaches h's sender again and tells n more records, the reader
// acknowledging none of them; h's sender is the new binding.
func tellAgain(t *testing.T, svc *Service, c ConversationID, h *history, n int, tok byte) {
	t.Helper()
	ctx := context.Background()
	cs := svc.Connect(nil)
	sender, err := cs.Attach(ctx, Attach{Conversation: c, Participant: h.sender.Participant, Generation: h.sender.Generation, Secret: h.sender.Secret, Token: token(tok)})
	must(t, err)
	for i := range n {
		_, err := cs.Tell(ctx, Tell{Conversation: c, Participant: sender.Participant, Generation: sender.Generation,
			Token: benchToken(uint64(tok), uint64(i)), Payload: []byte(fmt.Sprintf("more %d", i))})
		must(t, err)
	}
	must(t, cs.End(ctx, oplog.CauseConnectionLost))
	h.sender = sender
}

// TestCheckpoint_ChainsOfWindowsAndOlderVersionsLoad: a conversation
// checkpointed by an older version (its records inline, Version3) loads
// to the state a replay builds; the next checkpoint pass derives from it
// and writes a Version4 one (a window), from which the pass after derives
// again; after each, a start from the checkpoint builds the replay's
// state, and Inspect, which replays from row 0, finds nothing to refuse.
func TestCheckpoint_ChainsOfWindowsAndOlderVersionsLoad(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	p := pages{budget: newByteBudget(1 << 30), bytes: 512} // several pages of outbox rows
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 1})
	must(t, err)
	h := buildHistory(t, svc, 1, 60, 40)

	// The older version's checkpoint: what this one derives, with the
	// records inline instead of a window.
	old, rb, err := derive(ctx, mem, 1, p, nil, oplogLen(t, mem, 1), time.Now(), DefaultRetain)
	must(t, err)
	old.Window, old.Records = nil, rb.inline()
	enc, err := checkpoint.Encode(old)
	must(t, err)
	if enc[0] == checkpoint.Version4 || len(old.Records) != 40 {
		t.Fatalf("older checkpoint is version %d with %d records, want an older version with 40", enc[0], len(old.Records))
	}
	must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: enc}}))
	must(t, mem.Flush())

	check := func(when string, wantVersion byte) {
		t.Helper()
		b, err := mem.GetBytes(checkpoint.Key(1))
		must(t, err)
		if b[0] != wantVersion {
			t.Fatalf("%s: checkpoint is version %d, want %d", when, b[0], wantVersion)
		}
		fromCk, err := reconcile(ctx, mem, 1, p)
		must(t, err)
		if diff := cmp.Diff(replayState(t, mem, 1, p).State, fromCk.State, stateOpts); diff != "" {
			t.Fatalf("%s: state from the checkpoint differs from the replay from row 0 (-zero +checkpoint):\n%s", when, diff)
		}
		reports, err := Inspect(mem)
		must(t, err)
		for _, r := range reports {
			if r.Refused != nil {
				t.Fatalf("%s: Inspect refused %v: %+v", when, r.Conversation, r.Refused)
			}
		}
	}
	check("older version", enc[0])

	tellAgain(t, svc, 1, &h, 30, 0x71)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() from the older checkpoint = %d, %v, want 1, nil", n, err)
	}
	check("derived from the older version", checkpoint.Version4)

	// The reader acknowledges some, so the window moves, and more rows.
	cr := svc.Connect(nil)
	reader, err := cr.Attach(ctx, Attach{Conversation: 1, Participant: h.reader.Participant, Generation: h.reader.Generation, Secret: h.reader.Secret, Token: token(0x72)})
	must(t, err)
	ds := drainNext(cr, 1)
	_, err = cr.Ack(ctx, Ack{Conversation: 1, Participant: reader.Participant, Generation: reader.Generation, Through: ds[len(ds)/2].Seq})
	must(t, err)
	tellAgain(t, svc, 1, &h, 10, 0x73)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() from a window = %d, %v, want 1, nil", n, err)
	}
	check("derived from a window", checkpoint.Version4)
	must(t, svc.Close())

	// An older checkpoint whose inline records lie is refused by Inspect.
	bad := *old
	bad.Records = append([]checkpoint.Record(nil), old.Records...)
	bad.Records[3].Record.Cause++
	enc, err = checkpoint.Encode(&bad)
	must(t, err)
	must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: enc}}))
	reports, err := Inspect(mem)
	must(t, err)
	if len(reports) == 0 || reports[0].Refused == nil || reports[0].Refused.Class != ClassCheckpointMismatch {
		t.Fatalf("Inspect of an older checkpoint with a record that lies = %+v, want %s", reports, ClassCheckpointMismatch)
	}
}

// TestCheckpoint_AWindowNamingOtherRowsIsARefusal: a Version4 checkpoint
// that is well formed and matches its streams' digests, but whose window
// names rows that do not carry its records, contains its conversation as
// checkpoint_mismatch at a start, never loads other records.
func TestCheckpoint_AWindowNamingOtherRowsIsARefusal(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name   string
		damage func(w *checkpoint.Window)
	}{
		{"outbox row after", func(w *checkpoint.Window) { w.Outbox++ }},
		{"outbox row before", func(w *checkpoint.Window) { w.Outbox-- }},
		{"oplog row", func(w *checkpoint.Window) { w.Oplog-- }},
		{"first record after", func(w *checkpoint.Window) { w.First++ }},
		{"first record before", func(w *checkpoint.Window) { w.First-- }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mem := store.NewMemory()
			svc, err := Open(ctx, mem, Options{NodeKey: testKey, CheckpointRows: 1})
			must(t, err)
			buildHistory(t, svc, 1, 20, 6)
			buildHistory(t, svc, 2, 10, 0)
			if n, err := svc.CheckpointPass(ctx); err != nil || n != 2 {
				t.Fatalf("CheckpointPass() = %d, %v, want 2, nil", n, err)
			}
			must(t, svc.Close())
			ck, err := loadCheckpoint(mem, 1)
			must(t, err)
			if ck.Window == nil || ck.Window.First > ck.LastSeq {
				t.Fatalf("checkpoint window = %+v, want one retaining records", ck.Window)
			}
			tt.damage(ck.Window)
			if err := ck.WellFormed(); err != nil {
				t.Fatalf("damaged checkpoint is not well formed (%v): the test would not reach the rows", err)
			}
			enc, err := checkpoint.Encode(ck)
			must(t, err)
			must(t, mem.PutBytes([]store.Bytes{{Key: checkpoint.Key(1), Value: enc}}))
			must(t, mem.Flush())
			svc = openService(t, mem)
			unl := svc.Unloadable()
			if len(unl) != 1 || unl[0].Conversation != 1 || unl[0].Class != ClassCheckpointMismatch {
				t.Fatalf("Unloadable() = %+v, want conversation 1 as %s", unl, ClassCheckpointMismatch)
			}
		})
	}
}
