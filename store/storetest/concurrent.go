package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/participantd/participantd/store"
)

// testConcurrent runs 64 goroutines that append to their own stream and
// race for a shared one, flushing as they go. Every stream must end up
// gap-free with every append exactly once, and, after a restart, keep all
// of it (each goroutine's last call is a Flush).
func testConcurrent(t *testing.T, h Harness) {
	s := h.Open(t)
	const writers, perWriter = 64, 40
	own := func(w int) string { return fmt.Sprintf("own/%02d", w) }

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- concurrentWriter(s, w, own(w), perWriter)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	check := func(t *testing.T) {
		for w := range writers {
			var want [][]byte
			for i := range perWriter {
				want = append(want, payload(own(w), uint64(i)))
			}
			checkStream(t, s, own(w), want)
		}
		shared, err := s.ReadFrom("shared", 0, 0)
		if err != nil {
			t.Fatalf("ReadFrom(shared) error: %v", err)
		}
		if len(shared) != writers*perWriter {
			t.Fatalf("shared has %d entries, want %d", len(shared), writers*perWriter)
		}
		seen := make(map[string]bool)
		for i, e := range shared {
			if e.Seq != uint64(i) {
				t.Fatalf("shared[%d].Seq = %d, want %d", i, e.Seq, i)
			}
			if seen[string(e.Payload)] {
				t.Fatalf("shared holds %q twice", e.Payload)
			}
			seen[string(e.Payload)] = true
		}
	}
	check(t)
	if h.Restart != nil {
		s = h.Restart(t, s)
		check(t)
	}
}

// concurrentWriter is one goroutine of testConcurrent. It returns its first
// failure rather than calling t.Fatal, which only the test goroutine may.
func concurrentWriter(s store.DurableStore, w int, own string, n int) error {
	for i := range n {
		if got, err := s.Append(own, payload(own, uint64(i)), uint64(i)); err != nil || got != uint64(i) {
			return fmt.Errorf("writer %d: Append(%q, seq=%d) = %d, %v, want %d", w, own, i, got, err, i)
		}
		// Race for the shared stream: read its length, append, and retry
		// on a conflict.
		for {
			seq, err := s.Len("shared")
			if err != nil {
				return fmt.Errorf("writer %d: Len(shared): %v", w, err)
			}
			got, err := s.Append("shared", []byte(fmt.Sprintf("%d/%d", w, i)), seq)
			if errors.Is(err, store.ErrSequenceConflict) {
				continue
			}
			if err != nil || got != seq {
				return fmt.Errorf("writer %d: Append(shared, seq=%d) = %d, %v, want %d", w, seq, got, err, seq)
			}
			break
		}
		if i%3 == 2 || i == n-1 {
			if err := s.Flush(); err != nil {
				return fmt.Errorf("writer %d: Flush: %v", w, err)
			}
		}
	}
	return nil
}
