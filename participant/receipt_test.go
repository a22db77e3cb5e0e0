package participant

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
)

// compactedHistory builds conversation 1 with tells acknowledged tells,
// checkpoints and compacts it, and returns the service, its store, the
// history and the first oplog row still stored.
func compactedHistory(t *testing.T, tells int) (*Service, *store.Memory, history, uint64, Options) {
	t.Helper()
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	h := buildHistory(t, svc, 1, tells, 0)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	clk.advance(2 * time.Minute)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	first := firstOf(t, mem, oplog.Stream(1))
	if got.Receipts < tells/2 || first < uint64(tells/2) {
		t.Fatalf("CompactPass() = %+v, oplog first %d: want most of %d tells compacted", got, first, tells)
	}
	return svc, mem, h, first, opts
}

// retryTells retries tells [0, n) of buildHistory's conversation 1 and
// fails t unless each replays its original seq.
func retryTells(t *testing.T, svc *Service, h history, n int) {
	t.Helper()
	c := svc.Connect(nil)
	for i := range n {
		told, err := c.Tell(context.Background(), Tell{Conversation: 1, Participant: h.sender.Participant, Generation: 1,
			Token: benchToken(1, uint64(i)), Payload: []byte(fmt.Sprintf("tell %d of %v", i, ConversationID(1)))})
		if err != nil || told.Replay != ReplayCommitted || told.Seq != Seq(3+i) {
			t.Fatalf("retry of tell %d after compaction = %+v, %v, want seq %d replayed", i, told, err, 3+i)
		}
	}
}

// TestReceipt_Version1ReceiptsStillReplay: a store compacted before
// receipts had version 2 holds version 1 receipts under their decimal
// keys; every token they stand for still replays its original answer
// after an upgrade, next to version 2 receipts of later compactions.
func TestReceipt_Version1ReceiptsStillReplay(t *testing.T) {
	const tells = 60
	svc, mem, h, first, opts := compactedHistory(t, tells)
	must(t, svc.Close())
	// Rewrite the receipts of the first half exactly as version 1 wrote
	// them, under version 1's keys; the second half stays version 2.
	v1 := 0
	for i := range first / 2 {
		b, err := mem.GetBytes(receipt.Key(1, i))
		must(t, err)
		if b == nil {
			continue
		}
		r, err := receipt.Decode(b)
		must(t, err)
		old, err := receipt.EncodeV1(r)
		must(t, err)
		must(t, mem.PutBytes([]store.Bytes{{Key: receipt.Key(1, i)}, {Key: receipt.KeyV1(1, i), Value: old}}))
		v1++
	}
	if v1 < tells/4 {
		t.Fatalf("rewrote %d receipts as version 1, want at least %d", v1, tells/4)
	}
	svc, err := Open(context.Background(), mem, opts)
	must(t, err)
	defer svc.Close()
	retryTells(t, svc, h, tells)
}

// TestReceipt_DamagedReceiptIsUnavailableNeverACommit: a receipt whose
// token was damaged no longer matches its token, which without a check
// would read as "never committed" and let the retry commit a second time.
// The CRC makes it unavailable, and nothing is committed.
func TestReceipt_DamagedReceiptIsUnavailableNeverACommit(t *testing.T) {
	svc, mem, h, first, _ := compactedHistory(t, 20)
	defer svc.Close()
	var key string
	var b []byte
	var r *receipt.Receipt
	for idx := range first {
		v, err := mem.GetBytes(receipt.Key(1, idx))
		must(t, err)
		if v == nil {
			continue
		}
		if r, err = receipt.Decode(v); err != nil {
			t.Fatal(err)
		}
		if r.Kind == oplog.KindTell {
			key, b = receipt.Key(1, idx), v
			break
		}
	}
	if b == nil {
		t.Fatal("no tell's receipt written")
	}
	i := int(r.Seq) - 3 // the tells of buildHistory have seqs from 3
	b[2] ^= 0x01        // the token's first byte
	must(t, mem.PutBytes([]store.Bytes{{Key: key, Value: b}}))
	before := oplogLen(t, mem, 1)
	c := svc.Connect(nil)
	_, err := c.Tell(context.Background(), Tell{Conversation: 1, Participant: h.sender.Participant, Generation: 1,
		Token: benchToken(1, uint64(i)), Payload: []byte(fmt.Sprintf("tell %d of %v", i, ConversationID(1)))})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeUnavailable {
		t.Fatalf("retry of tell %d whose receipt is damaged = %v, want unavailable", i, err)
	}
	if after := oplogLen(t, mem, 1); after != before {
		t.Fatalf("oplog grew from %d to %d rows: the retry committed", before, after)
	}
}

// openFixture decompresses testdata/name.gz into a fresh directory and
// opens it as a bbolt store.
func openFixture(t *testing.T, name string) *boltstore.Store {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name+".gz"))
	must(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	must(t, err)
	raw, err := io.ReadAll(zr)
	must(t, err)
	path := filepath.Join(t.TempDir(), name)
	must(t, os.WriteFile(path, raw, 0o600))
	st, err := boltstore.Open(path, boltstore.Options{})
	must(t, err)
	t.Cleanup(func() { st.Close() })
	return st
}

// TestReceipt_FileCompactedBeforeVersion2Replays opens a data file that
// the code before receipts of version 2 wrote and compacted offline
// (testdata/v1receipts.db.gz: conversation 1, enrolls with tokens {1} and
// {2}, 40 tells with tokens {3, i} and payloads "tell i", seqs 3+i, every
// one acknowledged, then participant.Compact with Retain 1ns; the node key
// is zero; written by a program against commit 188ed84 of this package). Every tell replays from its version 1 receipt, a tell with
// another payload is token_conflict, and after more tells and a compaction
// with this code, version 1 and version 2 receipts replay side by side.
func TestReceipt_FileCompactedBeforeVersion2Replays(t *testing.T) {
	ctx := context.Background()
	st := openFixture(t, "v1receipts.db")
	v1 := 0
	for idx := range uint64(90) {
		b, err := st.GetBytes(receipt.KeyV1(1, idx))
		must(t, err)
		if b != nil && b[0] == receipt.Version1 {
			v1++
		}
	}
	if first, err := st.First(oplog.Stream(1)); err != nil || first < 40 || v1 < 40 {
		t.Fatalf("fixture: oplog first %d (%v), %d version 1 receipts; want the 40 tells compacted", first, err, v1)
	}
	clk := &clock{now: time.Now()}
	// The fixture's enrolls committed when it was made: a receipt lifetime
	// of a century keeps their secrets replayable whenever this runs.
	svc, err := Open(ctx, st, Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, ReceiptTTL: 100 * 365 * 24 * time.Hour, Now: clk.Now})
	must(t, err)
	defer svc.Close()
	a, b := svc.Connect(nil), svc.Connect(nil)
	retry := func(i int, payload string) (Told, error) {
		return a.Tell(ctx, Tell{Conversation: 1, Participant: 0, Generation: 1, Token: Token{3, byte(i)}, Payload: []byte(payload)})
	}
	for i := range 40 {
		told, err := retry(i, fmt.Sprintf("tell %d", i))
		if err != nil || told.Replay != ReplayCommitted || told.Seq != Seq(3+i) {
			t.Fatalf("retry of tell %d from a version 1 receipt = %+v, %v, want seq %d replayed", i, told, err, 3+i)
		}
		_, err = retry(i, "something else")
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != CodeTokenConflict {
			t.Fatalf("retry of tell %d with another payload = %v, want token_conflict", i, err)
		}
	}
	// Attach both participants again, tell more, and compact with this code.
	ea, err := a.Enroll(ctx, Enroll{Conversation: 1, Token: Token{1}})
	must(t, err)
	eb, err := b.Enroll(ctx, Enroll{Conversation: 1, Token: Token{2}})
	must(t, err)
	if ea.Participant != 0 || eb.Participant != 1 || ea.Replay == ReplayNone || eb.Replay == ReplayNone {
		t.Fatalf("enroll retries = %+v, %+v, want participants 0 and 1 replayed", ea, eb)
	}
	_, err = a.Attach(ctx, Attach{Conversation: 1, Participant: 0, Generation: 1, Secret: ea.Secret, Token: Token{4}})
	must(t, err)
	_, err = b.Attach(ctx, Attach{Conversation: 1, Participant: 1, Generation: 1, Secret: eb.Secret, Token: Token{5}})
	must(t, err)
	for i := 40; i < 60; i++ {
		told, err := a.Tell(ctx, Tell{Conversation: 1, Participant: 0, Generation: 2, Token: Token{3, byte(i)}, Payload: []byte(fmt.Sprintf("tell %d", i))})
		must(t, err)
		_, err = b.Ack(ctx, Ack{Conversation: 1, Participant: 1, Generation: 2, Through: told.Seq})
		must(t, err)
		if i == 40 {
			// The sender acknowledges what it received too: the record
			// of b's attach, just before its first tell.
			_, err = a.Ack(ctx, Ack{Conversation: 1, Participant: 0, Generation: 2, Through: told.Seq - 1})
			must(t, err)
		}
	}
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	clk.advance(2 * time.Minute)
	got, err := svc.CompactPass(ctx)
	if err != nil || got.Receipts < 20 {
		t.Fatalf("CompactPass() = %+v, %v; want the new tells' receipts written", got, err)
	}
	for i := range 60 {
		gen := Generation(1)
		if i >= 40 {
			gen = 2
		}
		told, err := a.Tell(ctx, Tell{Conversation: 1, Participant: 0, Generation: gen, Token: Token{3, byte(i)}, Payload: []byte(fmt.Sprintf("tell %d", i))})
		if err != nil || told.Replay != ReplayCommitted {
			t.Fatalf("retry of tell %d after a compaction with version 2 = %+v, %v, want a replay", i, told, err)
		}
	}
}
