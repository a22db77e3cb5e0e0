package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
)

// StatsStore is a store.DurableStore that counts its commits, as boltstore and
// the log-first store do.
type StatsStore interface {
	store.DurableStore
	Stats() store.Stats
}

// BenchAppendFlush measures Append followed by Flush, the shape of one
// commit barrier, on s with writers goroutines on distinct streams
// (128-byte payloads), b.N appends in all. It reports ops/s and
// commits/op: with group commit, many writers share commits, so
// commits/op falls well below 1. s must be empty; the caller closes it.
func BenchAppendFlush(b *testing.B, s StatsStore, writers int) {
	payload := make([]byte, 128)
	before := s.Stats().Commits

	errs := make(chan error, writers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range writers {
		n := b.N / writers
		if w < b.N%writers {
			n++
		}
		wg.Go(func() {
			stream := fmt.Sprintf("bench/%02d", w)
			for seq := range uint64(n) {
				if _, err := s.Append(stream, payload, seq); err != nil {
					errs <- err
					return
				}
				if err := s.Flush(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(s.Stats().Commits-before)/float64(b.N), "commits/op")
}
