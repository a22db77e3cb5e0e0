package participant

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
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
		b, err := mem.GetBytes(receiptKey(1, i))
		must(t, err)
		if b == nil {
			continue
		}
		r, err := decodeReceipt(b)
		must(t, err)
		old, err := encodeReceiptV1(r)
		must(t, err)
		must(t, mem.PutBytes([]store.Bytes{{Key: receiptKey(1, i)}, {Key: receiptKeyV1(1, i), Value: old}}))
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
	var r *receipt
	for idx := range first {
		v, err := mem.GetBytes(receiptKey(1, idx))
		must(t, err)
		if v == nil {
			continue
		}
		if r, err = decodeReceipt(v); err != nil {
			t.Fatal(err)
		}
		if r.Kind == oplog.KindTell {
			key, b = receiptKey(1, idx), v
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

// TestReceipt_EncodingIsCompactAndExact: a tell's receipt and its key stay
// small (they are kept forever, one per operation), and every field comes
// back exactly, for both versions.
func TestReceipt_EncodingIsCompactAndExact(t *testing.T) {
	row := oplog.Row{Kind: oplog.KindTell, Participant: 3, Generation: 2, Token: benchToken(7, 123456),
		Seq: 1_234_567, Cursor: 1_234_500, At: 1_764_500_000_000, Payload: []byte("a payload")}
	b, err := encodeReceipt(&row)
	must(t, err)
	key := receiptKey(12345678901234567890, 9_999_999)
	if len(b) > 52 || len(key) > 40 {
		t.Errorf("a tell's receipt is %d bytes under a %d-byte key, want at most 52 and 40", len(b), len(key))
	}
	got, err := decodeReceipt(b)
	must(t, err)
	want := &receipt{Kind: row.Kind, Participant: row.Participant, Generation: row.Generation, Token: row.Token,
		Seq: row.Seq, Cursor: row.Cursor, At: row.At, PayloadHash: payloadHash(row.Payload)}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(receipt{})); diff != "" {
		t.Errorf("decoded receipt (-want +got):\n%s", diff)
	}
	old, err := encodeReceiptV1(want)
	must(t, err)
	got, err = decodeReceipt(old)
	must(t, err)
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(receipt{})); diff != "" {
		t.Errorf("decoded version 1 receipt (-want +got):\n%s", diff)
	}
	enroll := oplog.Row{Kind: oplog.KindEnroll, Participant: 4, Generation: 1, Token: benchToken(7, 1), Seq: 9, At: -5}
	b, err = encodeReceipt(&enroll)
	must(t, err)
	got, err = decodeReceipt(b)
	must(t, err)
	wantEnroll := &receipt{Kind: enroll.Kind, Participant: enroll.Participant, Generation: enroll.Generation, Token: enroll.Token,
		Seq: enroll.Seq, At: enroll.At}
	if diff := cmp.Diff(wantEnroll, got, cmp.AllowUnexported(receipt{})); diff != "" {
		t.Errorf("decoded enroll receipt (-want +got):\n%s", diff)
	}
	for n := range len(b) {
		if _, err := decodeReceipt(b[:n]); !errors.Is(err, errReceiptCorrupt) {
			t.Errorf("receipt cut to %d of %d bytes decoded: %v", n, len(b), err)
		}
	}
}
