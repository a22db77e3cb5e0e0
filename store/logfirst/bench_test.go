package logfirst_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/storetest"
)

// BenchmarkLogfirst_AppendFlush measures Append then Flush, the shape of
// one commit barrier, with 1 writer and 64 writers on distinct streams,
// beside the physical reference of the same run: one goroutine appending
// 200 B to a file and fsyncing it (participantbench's fsync probe).
// Targets: writers=1 at 0.8x the probe or better, writers=64 at 8x
// writers=1 or better (group commit: one record, one fdatasync, for many
// flushes).
func BenchmarkLogfirst_AppendFlush(b *testing.B) {
	b.Run("fsync-probe", benchFsyncProbe)
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			benchAppendFlush(b, writers)
		})
	}
}

func benchFsyncProbe(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "probe"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 200)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

func benchAppendFlush(b *testing.B, writers int) {
	s, err := logfirst.Open(b.TempDir(), logfirst.Options{})
	if err != nil {
		b.Fatalf("Open error: %v", err)
	}
	defer s.Close()
	storetest.BenchAppendFlush(b, s, writers)
}

// BenchmarkLogfirst_OpenReplay measures Open of a store whose log holds
// records=N single-append batches (200 B payloads, over 1,024 streams)
// past the checkpoint, as a crash leaves it: the replay into bbolt is the
// start-up cost the log adds.
func BenchmarkLogfirst_OpenReplay(b *testing.B) {
	for _, records := range []int{100_000} {
		b.Run(fmt.Sprintf("records=%d", records), func(b *testing.B) {
			src := b.TempDir()
			s, err := logfirst.Open(src, logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: 1 << 62, MaxUncheckpointed: 1 << 40})
			if err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 200)
			var wg sync.WaitGroup
			for w := range 64 {
				wg.Go(func() {
					for j := range records / 64 {
						stream := fmt.Sprintf("oplog/%02d/%02d", w, j%16)
						if _, err := s.Append(stream, payload, uint64(j/16)); err != nil {
							b.Error(err)
							return
						}
						if err := s.Flush(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			logfirst.Abandon(s)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				dir := b.TempDir()
				copyDir(b, src, dir)
				b.StartTimer()
				s, err := logfirst.Open(dir, logfirst.Options{})
				if err != nil {
					b.Fatal(err)
				}
				rp := s.Replay()
				b.StopTimer()
				b.ReportMetric(float64(rp.Log.Records), "log-records")
				b.ReportMetric(rp.Duration.Seconds(), "replay-s")
				s.Close()
				b.StartTimer()
			}
		})
	}
}

func copyDir(b *testing.B, from, to string) {
	b.Helper()
	err := filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), raw, 0o600)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLogfirst_ReadValueMiss measures what a fresh token's lookup
// costs the store: a value no layer in memory holds, read from a bbolt
// file of 10,000 values, from 1 reader and from 8 at once.
func BenchmarkLogfirst_ReadValueMiss(b *testing.B) {
	s, err := logfirst.Open(b.TempDir(), logfirst.Options{CheckpointInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range 10_000 {
		if err := s.CAS(fmt.Sprintf("t/%08d", i), 0, uint64(i+1)); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		b.Fatal(err)
	}
	for _, readers := range []int{1, 8} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(readers)
			b.RunParallel(func(pb *testing.PB) {
				var key []byte
				for pb.Next() {
					// Every read a key never read before: a miss that
					// the store's read cache cannot answer.
					key = fmt.Appendf(key[:0], "m/%012d", next.Add(1))
					if _, err := s.ReadValue(string(key)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
