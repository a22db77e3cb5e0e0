package logfirst_test

import (
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/store/logfirst"
)

// A value a checkpoint landed and forgot from memory is read from bbolt
// as the checkpoint wrote it, though reads before the checkpoint shared a
// read transaction: a write transaction ends the shared one, whose
// snapshot would still say the key is absent.
func TestStore_ReadValueAfterACheckpoint_SeesTheCheckpoint(t *testing.T) {
	s := open(t, t.TempDir(), noCheckpoint)
	// Both reads load from bbolt, through the shared transaction.
	if v, err := s.ReadValue("a"); err != nil || v != 0 {
		t.Fatalf("ReadValue(a) = %d, %v; want 0, nil", v, err)
	}
	if err := s.CAS("b", 0, 7); err != nil {
		t.Fatalf("CAS(b, 0, 7): %v", err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if v, err := s.ReadValue("b"); err != nil || v != 7 {
		t.Fatalf("ReadValue(b) after its checkpoint = %d, %v; want 7, nil", v, err)
	}
}

// Readers never see a value go back while checkpoints land and forget
// the writes they read around: each key's value only grows, and a read
// after a write was flushed sees at least that write.
func TestStore_ReadValueDuringCheckpoints_NeverGoesBack(t *testing.T) {
	s := open(t, t.TempDir(), logfirst.Options{CheckpointInterval: time.Millisecond, CheckpointBytes: 1, SegmentSize: 4096})
	const (
		keys   = 4
		rounds = 150
	)
	var wg sync.WaitGroup
	for k := range keys {
		key := string(rune('a' + k))
		written := make(chan struct{})
		wg.Go(func() {
			defer close(written)
			for v := uint64(0); v < rounds; v++ {
				if err := s.CAS(key, v, v+1); err != nil {
					t.Errorf("CAS(%s, %d, %d): %v", key, v, v+1, err)
					return
				}
				if err := s.Flush(); err != nil {
					t.Errorf("Flush: %v", err)
					return
				}
				got, err := s.ReadValue(key)
				if err != nil || got != v+1 {
					t.Errorf("ReadValue(%s) after CAS to %d flushed = %d, %v", key, v+1, got, err)
					return
				}
			}
		})
		// A reader of the key that never writes it: what it sees only
		// grows.
		wg.Go(func() {
			var last uint64
			for last < rounds {
				select {
				case <-written:
					return
				default:
				}
				got, err := s.ReadValue(key)
				if err != nil {
					t.Errorf("ReadValue(%s): %v", key, err)
					return
				}
				if got < last {
					t.Errorf("ReadValue(%s) = %d after %d", key, got, last)
					return
				}
				last = got
			}
		})
	}
	wg.Wait()
}
