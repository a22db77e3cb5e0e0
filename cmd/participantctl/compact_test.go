package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/boltstore"
)

// TestCompact_RemovesSettledHistoryAndVerifyStaysOK compacts a stopped
// server's data whose records were all acknowledged: rows go, verify still
// reports ok, inspect --space accounts for the receipts, and a tell's
// retry still replays its original seq.
func TestCompact_RemovesSettledHistoryAndVerifyStaysOK(t *testing.T) {
	ctx := testCtx(t)
	bg := context.Background()
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, storeFile), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, participant.NodeKeySize)
	svc, err := participant.Open(bg, st, participant.Options{NodeKey: key})
	if err != nil {
		t.Fatal(err)
	}
	a, b := svc.Connect(nil), svc.Connect(nil)
	pa, err := a.Enroll(bg, participant.Enroll{Conversation: 1, Token: participant.Token{1}})
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.Enroll(bg, participant.Enroll{Conversation: 1, Token: participant.Token{2}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Ack(bg, participant.Ack{Conversation: 1, Participant: pa.Participant, Generation: 1, Through: 2}); err != nil {
		t.Fatal(err)
	}
	var first participant.Told
	for i := range 20 {
		told, err := a.Tell(bg, participant.Tell{Conversation: 1, Participant: pa.Participant, Generation: 1,
			Token: participant.Token{3, byte(i)}, Payload: []byte("hi")})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = told
		}
		if _, err := b.Ack(bg, participant.Ack{Conversation: 1, Participant: pb.Participant, Generation: 1, Through: told.Seq}); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	out := mustCtl(t, ctx, "compact", "--data", dir, "--retain", "1ns", "--json")
	var l compactLine
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("compact --json = %q: %v", out, err)
	}
	if l.Checkpoints != 1 || l.Conversations != 1 || l.OplogRows < 30 || l.Receipts < 20 {
		t.Fatalf("compact = %+v, want one checkpoint and the settled history removed", l)
	}
	if out := mustCtl(t, ctx, "verify", "--data", dir); out != "conversation 1: ok\n" {
		t.Fatalf("verify after compact = %q", out)
	}
	checkSpace(t, ctx, dir)
	var rep inspectReport
	if err := json.Unmarshal([]byte(mustCtl(t, ctx, "inspect", "--data", dir, "--json")), &rep); err != nil || len(rep.Conversations) != 1 {
		t.Fatalf("inspect --json after compact = %+v, %v", rep, err)
	}
	text := mustCtl(t, ctx, "inspect", "--data", dir)

	st, err = boltstore.Open(filepath.Join(dir, storeFile), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if n, err := st.First(oplog.Stream(1)); err != nil || n == 0 {
		t.Fatalf("First(oplog/1) after compact = %d, %v, want > 0", n, err)
	}
	// inspect counts the rows still stored, not every row ever appended.
	c := rep.Conversations[0]
	for _, s := range []struct {
		stream            string
		stored, compacted uint64
	}{{oplog.Stream(1), c.OplogRows, c.OplogCompacted}, {outbox.Stream(1), c.OutboxRows, c.OutboxCompacted}} {
		n, err := st.Len(s.stream)
		if err != nil {
			t.Fatal(err)
		}
		first, err := st.First(s.stream)
		if err != nil {
			t.Fatal(err)
		}
		if s.stored != n-first || s.compacted != first {
			t.Errorf("inspect of %s = %d rows, %d compacted; want %d stored of %d appended", s.stream, s.stored, s.compacted, n-first, n)
		}
	}
	if want := fmt.Sprintf("oplog %d rows (%d compacted)", c.OplogRows, c.OplogCompacted); !strings.Contains(text, want) {
		t.Errorf("inspect =\n%s\nwant %q", text, want)
	}
	svc, err = participant.Open(bg, st, participant.Options{NodeKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	told, err := svc.Connect(nil).Tell(bg, participant.Tell{Conversation: 1, Participant: pa.Participant, Generation: 1,
		Token: participant.Token{3, 0}, Payload: []byte("hi")})
	if err != nil || told.Seq != first.Seq || told.Replay != participant.ReplayCommitted {
		t.Fatalf("retry of the first tell after compact = %+v, %v, want seq %v replayed", told, err, first.Seq)
	}
}

// checkSpace runs inspect --space on dir, compacted from 20 tells, and
// fails t unless it names the receipts, the token index and the streams
// with their pages, and the same in text.
func checkSpace(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	var sp boltfmt.Space
	out := mustCtl(t, ctx, "inspect", "--data", dir, "--space", "--json")
	if err := json.Unmarshal([]byte(out), &sp); err != nil {
		t.Fatalf("inspect --space --json = %q: %v", out, err)
	}
	keys := map[string]int{}
	var pages int64
	for _, b := range sp.Buckets {
		pages += b.LeafAlloc + b.BranchAlloc
		if b.Keys > 0 && (b.LeafInuse+b.InlineInuse <= 0 || b.LeafInuse > b.LeafAlloc) {
			t.Errorf("bucket %s: %d keys in %d of %d leaf bytes, %d inline", b.Name, b.Keys, b.LeafInuse, b.LeafAlloc, b.InlineInuse)
		}
		for _, p := range b.Prefixes {
			keys[b.Name+" "+p.Prefix] = p.Keys
		}
	}
	if keys["bytes receipt"] < 20 || keys["bytes checkpoint"] != 1 || keys["values token"] < 22 || keys["streams oplog"] == 0 {
		t.Errorf("inspect --space keys by bucket and prefix = %v; want the 20 tells' receipts, a checkpoint, 22 tokens and oplog rows", keys)
	}
	if sp.FileBytes < sp.HighWaterBytes || pages <= 0 || pages > sp.HighWaterBytes {
		t.Errorf("inspect --space: file %d B, high water %d B, buckets' pages %d B", sp.FileBytes, sp.HighWaterBytes, pages)
	}
	text := mustCtl(t, ctx, "inspect", "--data", dir, "--space")
	if !strings.Contains(text, "bucket bytes:") || !strings.Contains(text, "receipt") {
		t.Errorf("inspect --space =\n%s\nwant the bytes bucket and its receipts", text)
	}
}
