package store_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
)

// BenchmarkBolt_AppendFlush measures Append followed by Flush, the shape of
// one commit barrier, with 1 writer and with 64 writers on distinct streams.
// With group commit, 64 writers should share commits: commits/op falls well
// below 1 and ops/s rises well above the single writer's.
func BenchmarkBolt_AppendFlush(b *testing.B) {
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			benchAppendFlush(b, writers)
		})
	}
}

func benchAppendFlush(b *testing.B, writers int) {
	s, err := store.Open(filepath.Join(b.TempDir(), "data.db"), store.Options{})
	if err != nil {
		b.Fatalf("Open error: %v", err)
	}
	defer s.Close()
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
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
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
