package logfirst_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/wal"
)

var noCheckpoint = logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: math.MaxInt64, SegmentSize: 4096}

// fill writes n flushed batches of one append and one value write each.
func fill(t *testing.T, s store.DurableStore, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.Append("s", []byte(fmt.Sprintf("p%d", i)), uint64(i)); err != nil {
			t.Fatalf("Append(%d): %v", i, err)
		}
		if err := s.CAS("k", uint64(i), uint64(i+1)); err != nil {
			t.Fatalf("CAS(%d): %v", i, err)
		}
		if err := s.Flush(); err != nil {
			t.Fatalf("Flush(%d): %v", i, err)
		}
	}
}

func readAll(t *testing.T, s store.DurableStore) ([]store.Entry, uint64) {
	t.Helper()
	entries, err := s.ReadFrom("s", 0, 0)
	if err != nil {
		t.Fatalf("ReadFrom: %v", err)
	}
	v, err := s.ReadValue("k")
	if err != nil {
		t.Fatalf("ReadValue: %v", err)
	}
	return entries, v
}

// snapshot returns every file under dir with its content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		out[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestOpenReadOnly_ReplaysTheLogInMemoryAndChangesNoFile(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	fill(t, s, 20)
	wantEntries, wantV := readAll(t, s)
	logfirst.Abandon(s) // a crash: the log holds all 20 batches, bbolt none

	before := snapshot(t, dir)
	ro, err := logfirst.OpenReadOnly(dir, logfirst.Options{})
	if err != nil {
		t.Fatalf("OpenReadOnly: %v", err)
	}
	if got := ro.Replay().Log.Records; got != 20 {
		t.Fatalf("replayed %d records, want 20", got)
	}
	gotEntries, gotV := readAll(t, ro)
	if diff := cmp.Diff(wantEntries, gotEntries); diff != "" || gotV != wantV {
		t.Fatalf("read-only view: value %d, want %d; entries (-want +got):\n%s", gotV, wantV, diff)
	}
	if _, err := ro.Append("s", []byte("x"), 20); !errors.Is(err, logfirst.ErrReadOnly) {
		t.Fatalf("Append on a read-only store = %v, want ErrReadOnly", err)
	}
	if err := ro.CAS("k", 20, 21); !errors.Is(err, logfirst.ErrReadOnly) {
		t.Fatalf("CAS on a read-only store = %v, want ErrReadOnly", err)
	}
	if err := ro.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
		t.Fatalf("OpenReadOnly changed files (-before +after):\n%s", diff)
	}

	// A writable Open replays the same into bbolt, and then the bbolt file
	// alone, as the offline tools read it, holds everything.
	s = open(t, dir, noCheckpoint)
	if got := s.Replay().Log.Records; got != 20 {
		t.Fatalf("Open replayed %d records, want 20", got)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	b, err := boltstore.Open(filepath.Join(dir, logfirst.DBFile), boltstore.Options{})
	if err != nil {
		t.Fatalf("boltstore.Open of the checkpointed file: %v", err)
	}
	defer b.Close()
	gotEntries, gotV = readAll(t, b)
	if diff := cmp.Diff(wantEntries, gotEntries); diff != "" || gotV != wantV {
		t.Fatalf("bbolt file: value %d, want %d; entries (-want +got):\n%s", gotV, wantV, diff)
	}
}

func TestOpen_RefusesACorruptLogNamingSegmentAndOffset(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	fill(t, s, 3)
	logfirst.Abandon(s)
	segs, err := filepath.Glob(filepath.Join(dir, logfirst.WALDir, "*.wal"))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments = %v, %v; want 1", segs, err)
	}
	raw, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	raw[16+12] ^= 0x40 // inside the first record's body
	if err := os.WriteFile(segs[0], raw, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, open := range map[string]func() (*logfirst.Store, error){
		"Open":         func() (*logfirst.Store, error) { return logfirst.Open(dir, noCheckpoint) },
		"OpenReadOnly": func() (*logfirst.Store, error) { return logfirst.OpenReadOnly(dir, noCheckpoint) },
	} {
		s, err := open()
		var ce *wal.CorruptionError
		if !errors.As(err, &ce) || ce.Segment != filepath.Base(segs[0]) || ce.Offset != 16 {
			if s != nil {
				s.Close()
			}
			t.Fatalf("%s of a log with a bad first record = %v, want a CorruptionError at %s offset 16", name, err, filepath.Base(segs[0]))
		}
	}
}

func TestCheckpoint_AppliesToBboltAndRemovesSegments(t *testing.T) {
	dir := t.TempDir()
	opts := noCheckpoint
	opts.SegmentSize = 256
	s := open(t, dir, opts)
	fill(t, s, 100)
	want, wantV := readAll(t, s)
	if n := logfirst.Segments(s); n < 10 {
		t.Fatalf("%d segments before the checkpoint; want many", n)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if m, n := logfirst.Uncheckpointed(s), logfirst.Segments(s); m != 0 || n != 1 {
		t.Fatalf("after a checkpoint: %d bytes uncheckpointed, %d segments; want 0, 1", m, n)
	}
	got, gotV := readAll(t, s)
	if diff := cmp.Diff(want, got); diff != "" || gotV != wantV {
		t.Fatalf("after the checkpoint: value %d, want %d; (-want +got):\n%s", gotV, wantV, diff)
	}
	// More writes after the checkpoint, then a crash: Open replays only
	// what follows the checkpoint.
	for i := 100; i < 110; i++ {
		if _, err := s.Append("s", []byte(fmt.Sprintf("p%d", i)), uint64(i)); err != nil {
			t.Fatal(err)
		}
		if err := s.CAS("k", uint64(i), uint64(i+1)); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	want, wantV = readAll(t, s)
	logfirst.Abandon(s)
	s = open(t, dir, opts)
	if got := s.Replay(); got.Log.Records != 10 || got.CheckpointLSN != 100 {
		t.Fatalf("replay = %+v, want 10 records after checkpoint 100", got)
	}
	got, gotV = readAll(t, s)
	if diff := cmp.Diff(want, got); diff != "" || gotV != wantV {
		t.Fatalf("after the restart: value %d, want %d; (-want +got):\n%s", gotV, wantV, diff)
	}
}

func TestFlush_WaitsForACheckpointWhenMemoryIsFull(t *testing.T) {
	const bound = 64 << 10
	s := open(t, t.TempDir(), logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: math.MaxInt64, MaxUncheckpointed: bound})
	payload := make([]byte, 4<<10)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("w%d", w)
			for i := range 100 {
				if _, err := s.Append(name, payload, uint64(i)); err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				if err := s.Flush(); err != nil {
					t.Errorf("Flush: %v", err)
					return
				}
				// One record over the bound is the most memory may hold:
				// the record taken just before the bound was reached.
				if m := logfirst.Uncheckpointed(s); m > bound+8*(int64(len(payload))+64) {
					t.Errorf("uncheckpointed = %d bytes, bound %d", m, bound)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s.Checkpoints() < 10 {
		t.Fatalf("%d checkpoints; the memory bound should have forced many", s.Checkpoints())
	}
}

func TestReadValue_CacheNeverOutlivesACheckpointOfItsKey(t *testing.T) {
	s := open(t, t.TempDir(), noCheckpoint)
	for i := range uint64(5) {
		if v, err := s.ReadValue("k"); err != nil || v != i {
			t.Fatalf("ReadValue = %d, %v; want %d", v, err, i)
		}
		if err := s.CAS("k", i, i+1); err != nil {
			t.Fatalf("CAS(%d): %v", i, err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := logfirst.CheckpointNow(s); err != nil {
			t.Fatal(err)
		}
		// Read from bbolt (and cached) after the checkpoint, then again.
		for range 2 {
			if v, err := s.ReadValue("k"); err != nil || v != i+1 {
				t.Fatalf("ReadValue after checkpoint %d = %d, %v; want %d", i, v, err, i+1)
			}
		}
		if err := s.CAS("k", i, 99); err == nil {
			t.Fatalf("CAS from a stale value succeeded")
		}
	}
	if loads := s.Stats().ValueLoads; loads != 6 {
		t.Fatalf("%d loads from bbolt, want 6: the first and one after each checkpoint, the rest cached", loads)
	}
}

// An Open with nothing to replay (the last run closed cleanly, or its
// checkpoint covered the whole log) must leave bbolt's checkpoint LSN
// where it is: the log's records at or below it may be gone, so a crash
// before the next checkpoint must not make the next Open look for them.
func TestOpen_NothingToReplayKeepsTheCheckpointLSN(t *testing.T) {
	for _, writes := range []int{0, 1} {
		t.Run(fmt.Sprintf("%d writes before the crash", writes), func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, noCheckpoint)
			// 1 KiB records: Close's checkpoint removes every 4 KiB segment
			// but the last, which starts well after LSN 1.
			for i := range 20 {
				if _, err := s.Append("s", bytes.Repeat([]byte{byte(i)}, 1024), uint64(i)); err != nil {
					t.Fatalf("Append(%d): %v", i, err)
				}
				if err := s.CAS("k", uint64(i), uint64(i+1)); err != nil {
					t.Fatalf("CAS(%d): %v", i, err)
				}
				if err := s.Flush(); err != nil {
					t.Fatalf("Flush(%d): %v", i, err)
				}
			}
			wantEntries, wantV := readAll(t, s)
			if err := s.Close(); err != nil { // checkpoints all 20 records
				t.Fatalf("Close: %v", err)
			}

			s = open(t, dir, noCheckpoint)
			if got := s.Replay(); got.CheckpointLSN != 20 || got.Log.Records != 0 {
				t.Fatalf("reopen after Close: checkpoint LSN %v, %d records replayed, want 20 and 0", got.CheckpointLSN, got.Log.Records)
			}
			for i := range writes {
				n := uint64(len(wantEntries))
				p := []byte(fmt.Sprintf("after %d", i))
				if _, err := s.Append("s", p, n); err != nil {
					t.Fatalf("Append: %v", err)
				}
				if err := s.Flush(); err != nil {
					t.Fatalf("Flush: %v", err)
				}
				wantEntries = append(wantEntries, store.Entry{Seq: n, Payload: p})
			}
			logfirst.Abandon(s) // a crash before any checkpoint

			s, err := logfirst.Open(dir, noCheckpoint)
			if err != nil {
				t.Fatalf("Open after a crash: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			if got := s.Replay(); got.CheckpointLSN != 20 || got.Log.Records != writes {
				t.Errorf("Open after a crash: checkpoint LSN %v, %d records replayed, want 20 and %d", got.CheckpointLSN, got.Log.Records, writes)
			}
			gotEntries, gotV := readAll(t, s)
			if diff := cmp.Diff(wantEntries, gotEntries); diff != "" {
				t.Errorf("entries after the crash (-want +got):\n%s", diff)
			}
			if gotV != wantV {
				t.Errorf("value after the crash = %d, want %d", gotV, wantV)
			}
		})
	}
}

func TestCheckpointLSN_NeverGoesBack(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	fill(t, s, 3)
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if err := logfirst.PutCheckpointLSN(s, 2); !errors.Is(err, logfirst.ErrCheckpointBehind) {
		t.Fatalf("lowering the checkpoint LSN from 3 to 2: %v, want ErrCheckpointBehind", err)
	}
	if err := logfirst.PutCheckpointLSN(s, 3); err != nil {
		t.Fatalf("recording the same checkpoint LSN again: %v", err)
	}
	logfirst.Abandon(s)
	s = open(t, dir, noCheckpoint)
	if got := s.Replay().CheckpointLSN; got != 3 {
		t.Errorf("checkpoint LSN after the refused write = %v, want 3", got)
	}
}
