package offline_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/tokenindex"
)

// segmentSize keeps faultfs's copies of the log small.
const segmentSize = 64 << 10

// killed leaves st as a SIGKILL would: it fails the store at its next log
// write, so that Close checkpoints nothing, and drops what no fsync
// covered. The log keeps every flushed record after the file's checkpoint.
func killed(t *testing.T, ffs *faultfs.FS, st *logfirst.Store) {
	t.Helper()
	ffs.SetRule(faultfs.CutAt(ffs.Ops()))
	if err := st.CAS("killed", 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := st.Flush(); err == nil {
		t.Fatal("Flush after the cut succeeded")
	}
	st.Close() // fails: the store's writes failed at the cut
	if err := ffs.Crash(rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
}

// TestCompact_AfterACrash_NeverLowersTheLogsTokenFloor is issue 17's
// failure 12: a live compaction pass raised the token floor to F1 and
// forgot the tokens below it, all in log records the file lacks when the
// server is killed; offline compact, later, raises the floor to F2 and
// forgets the tokens in [F1, F2). Had it written the file alone, the next
// start's replay would write F1 back over F2, and a retry of a token in
// [F1, F2) would commit a second time. Through the log, every retry
// replays or is token_expired, with the window turned off.
func TestCompact_AfterACrash_NeverLowersTheLogsTokenFloor(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ffs := faultfs.New()
	// Nothing is checkpointed into the file unless the test asks.
	st, err := logfirst.Open(dir, logfirst.Options{FS: ffs, SegmentSize: segmentSize, CheckpointInterval: time.Hour, CheckpointBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	clk := participanttest.NewClock(time.UnixMilli(1_700_000_000_000))
	window := participant.Options{NodeKey: participanttest.NodeKey, CheckpointRows: 1, Retain: time.Second,
		TokenWindow: time.Minute, TokenSkew: time.Second, Now: clk.Now}
	svc, err := participant.Open(ctx, st, window)
	if err != nil {
		t.Fatal(err)
	}
	cs, cr := svc.Connect(nil), svc.Connect(nil)
	snd, err := cs.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participanttest.V7Token(clk.Now(), 1)})
	if err != nil {
		t.Fatal(err)
	}
	rcv, err := cr.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participanttest.V7Token(clk.Now(), 2)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Ack(ctx, participant.Ack{Conversation: 1, Participant: snd.Participant, Generation: 1, Through: 2}); err != nil {
		t.Fatal(err)
	}
	type answered struct {
		req  participant.Tell
		told participant.Told
	}
	var tells []answered
	for i := range 12 {
		req := participant.Tell{Conversation: 1, Participant: snd.Participant, Generation: 1,
			Token: participanttest.V7Token(clk.Now(), uint64(10+i)), Payload: []byte{byte(i)}}
		told, err := cs.Tell(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		tells = append(tells, answered{req, told})
		if _, err := cr.Ack(ctx, participant.Ack{Conversation: 1, Participant: rcv.Participant, Generation: 1, Through: told.Seq}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(20 * time.Second)
		if _, err := svc.CheckpointPass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Everything so far is in the file ...
	if _, err := st.Backup(io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	// ... but this pass's floor F1, its forgotten entries and its trims
	// are in the log alone.
	got, err := svc.CompactPass(ctx)
	if err != nil || got.Forgotten == 0 {
		t.Fatalf("the live compaction pass = %+v, %v; want tokens forgotten", got, err)
	}
	f1, err := st.ReadValue(tokenindex.FloorKey(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
	killed(t, ffs, st)

	later := participanttest.NewClock(clk.Now().Add(10 * time.Minute))
	rep, err := offline.Compact(ctx, dir, offline.Options{LogFS: ffs, LogSegmentSize: segmentSize}, participant.Options{Retain: time.Second,
		TokenWindow: time.Minute, TokenSkew: time.Second, Now: later.Now})
	if err != nil || rep.Compacted.Forgotten == 0 {
		t.Fatalf("offline compact = %+v, %v; want tokens forgotten", rep, err)
	}

	st, err = logfirst.Open(dir, logfirst.Options{FS: ffs, SegmentSize: segmentSize})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if f2, err := st.ReadValue(tokenindex.FloorKey(1)); err != nil || f2 <= f1 {
		t.Errorf("after offline compact and a start, the token floor = %d, %v; want above the live pass's %d", f2, err, f1)
	}
	// The window off: only the persisted floor refuses a forgotten token.
	svc, err = participant.Open(ctx, st, participant.Options{NodeKey: participanttest.NodeKey})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	c := svc.Connect(nil)
	for i, a := range tells {
		r, err := c.Tell(ctx, a.req)
		if errors.Is(err, participant.ErrTokenExpired) {
			continue
		}
		if err != nil || r.Seq != a.told.Seq || r.Replay != participant.ReplayCommitted {
			t.Errorf("retry of tell %d = %+v, %v; want seq %v replayed, or token_expired", i, r, err, a.told.Seq)
		}
	}
}
