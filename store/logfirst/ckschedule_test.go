package logfirst_test

import (
	"bytes"
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
