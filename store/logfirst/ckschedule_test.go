package logfirst_test

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/store/logfirst"
)

// The bytes a running checkpoint took do not count toward the next one:
// the next is queued only once CheckpointBytes more are logged, not as
// soon as the running one's and a few more reach the bound. Counting
// them made checkpoints run back to back under a steady load, each of
// what one checkpoint's duration let in.
func TestStore_CheckpointKick_CountsOnlyBytesNotTaken(t *testing.T) {
	const bound = 64 << 10
	s := open(t, t.TempDir(), logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: bound})
	// The checkpointer's checkpoint stops after its commit (its count of
	// bbolt's pages, a read transaction), still holding what it took.
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	var released sync.Once
	// Before Close (a cleanup), which waits for the checkpointer.
	defer released.Do(func() { close(release) })
	logfirst.SetViewed(s, func() {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	})
	appendFlush := func(stream string, n int) {
		t.Helper()
		for range n {
			seq, err := s.Len(stream)
			if err != nil {
				t.Fatalf("Len: %v", err)
			}
			if _, err := s.Append(stream, bytes.Repeat([]byte{'x'}, 1024), seq); err != nil {
				t.Fatalf("Append: %v", err)
			}
		}
		if err := s.Flush(); err != nil {
			t.Fatalf("Flush: %v", err)
		}
	}
	// Create the streams first: a stream's first use reads bbolt.
	appendFlush("a", 1)
	appendFlush("b", 1)
	armed.Store(true)
	appendFlush("a", bound/1024) // reaches the bound: kicks the checkpointer
	<-entered
	if logfirst.CheckpointKicked(s) {
		t.Fatal("a checkpoint is queued before anything was logged after the running one took its bytes")
	}
	// Half the bound more: with the running checkpoint's bytes counted,
	// this reached the bound and queued the next checkpoint at once.
	appendFlush("b", bound/2/1024)
	if logfirst.CheckpointKicked(s) {
		t.Fatalf("a checkpoint is queued with %d bytes uncheckpointed, over %d of them taken by the running one: only the others count", logfirst.Uncheckpointed(s), bound)
	}
	// The rest of the bound: now the next one is due.
	appendFlush("b", bound/2/1024)
	if !logfirst.CheckpointKicked(s) {
		t.Fatal("no checkpoint queued once the bytes logged since the running one took its own reached the bound")
	}
}

// A checkpoint writes a stream's long run of entries in pieces, yielding
// between them, all in its one transaction: after a crash right after it,
// every entry is read back from bbolt, in order, and nothing is replayed.
func TestStore_CheckpointOfALongRun_WritesEveryPiece(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	const n = 1000 // many pieces, and a last one shorter than the others
	for i := range n {
		if _, err := s.Append("long", fmt.Appendf(nil, "entry %d", i), uint64(i)); err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
	}
	if _, err := s.Append("short", []byte("one"), 0); err != nil {
		t.Fatalf("Append: %v", err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	logfirst.Abandon(s)
	s = open(t, dir, noCheckpoint)
	if got := s.Replay().Log.Records; got != 0 {
		t.Errorf("the reopen replayed %d records; the checkpoint held them all", got)
	}
	got, err := s.ReadFrom("long", 0, 0)
	if err != nil || len(got) != n {
		t.Fatalf("ReadFrom(long) = %d entries, %v; want %d", len(got), err, n)
	}
	for i, e := range got {
		if want := fmt.Sprintf("entry %d", i); e.Seq != uint64(i) || string(e.Payload) != want {
			t.Fatalf("entry %d = seq %d %q; want %q", i, e.Seq, e.Payload, want)
		}
	}
	if got, err := s.ReadFrom("short", 0, 0); err != nil || len(got) != 1 || string(got[0].Payload) != "one" {
		t.Fatalf("ReadFrom(short) = %v, %v", got, err)
	}
}
