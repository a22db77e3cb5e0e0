package logfirst_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// openOnFaultFS opens a store that checkpoints only when told to
// (noCheckpoint) in a new directory on a new faultfs.
func openOnFaultFS(t *testing.T) (*faultfs.FS, string, logfirst.Options, *logfirst.Store) {
	t.Helper()
	ffs := faultfs.New()
	dir := t.TempDir()
	opts := noCheckpoint
	opts.FS = ffs
	s, err := logfirst.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return ffs, dir, opts, s
}

// failSyncOf makes the next Sync of a file whose path has prefix fail
// the Linux way (faultfs.FailSync), once.
func failSyncOf(ffs *faultfs.FS, kind faultfs.OpKind, prefix string) {
	done := false
	ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		if !done && op.Kind == kind && strings.HasPrefix(op.Path, prefix) {
			done = true
			return faultfs.FailSync
		}
		return faultfs.None
	})
}

// A log fdatasync that fails the Linux way, a restart without a reboot
// (the page cache still serves the unwritten record), more acknowledged
// writes, then a power cut: the store opens and holds every write
// acknowledged, before the failure and after the restart. The record whose
// sync failed was never acknowledged: it may be there or not.
func TestFailedLogSync_RestartWithoutARebootThenAPowerCut(t *testing.T) {
	big := bytes.Repeat([]byte{'z'}, 3000) // over several sectors: a crash tears it
	for seed := range uint64(60) {
		ffs, dir, opts, s := openOnFaultFS(t)
		fill(t, s, 3)
		failSyncOf(ffs, faultfs.OpSync, filepath.Join(dir, logfirst.WALDir))
		if _, err := s.Append("s", big, 3); err != nil {
			t.Fatalf("Append: %v", err)
		}
		if err := s.Flush(); !errors.Is(err, store.ErrFailed) {
			t.Fatalf("Flush whose log sync failed = %v, want store.ErrFailed", err)
		}
		logfirst.Abandon(s)

		// The restart: no Crash, so the page cache serves the record.
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("seed %d: Open after the failed sync: %v", seed, err)
		}
		n, err := s.Len("s")
		if err != nil {
			t.Fatal(err)
		}
		var acked [][]byte
		for i := range 3 {
			p := []byte(fmt.Sprintf("after-%d", i))
			if _, err := s.Append("s", p, n+uint64(i)); err != nil {
				t.Fatalf("Append after the restart: %v", err)
			}
			if err := s.Flush(); err != nil {
				t.Fatalf("Flush after the restart: %v", err)
			}
			acked = append(acked, p)
		}
		logfirst.Abandon(s)

		if err := ffs.Crash(rand.New(rand.NewPCG(seed, 25))); err != nil {
			t.Fatal(err)
		}
		s, err = logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("seed %d: Open after the power cut: %v", seed, err)
		}
		entries, err := s.ReadFrom("s", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]byte
		for _, e := range entries {
			got = append(got, e.Payload)
		}
		for i := range 3 {
			if i >= len(got) || string(got[i]) != fmt.Sprintf("p%d", i) {
				t.Fatalf("seed %d: after the power cut entry %d is missing or wrong (%d entries)", seed, i, len(got))
			}
		}
		if len(got) < len(acked) || !bytes.Equal(bytes.Join(got[len(got)-len(acked):], nil), bytes.Join(acked, nil)) {
			t.Fatalf("seed %d: after the power cut %d entries, the writes acknowledged after the restart are not the last ones", seed, len(got))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A data file of a newer layout version (written by a newer binary) is
// refused, by Open and OpenReadOnly, with an error that names the layout
// version, and no file of the directory changes: a downgrade never
// rewrites or drops what a newer version wrote.
func TestOpen_RefusesADataFileOfANewerLayoutVersion(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	fill(t, s, 5)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, logfirst.DBFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("version"), []byte{0xfe}) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dir)
	if _, err := logfirst.Open(dir, noCheckpoint); err == nil || !strings.Contains(err.Error(), "layout version") {
		t.Fatalf("Open of a file of layout version 254 = %v, want a refusal naming the layout version", err)
	}
	if _, err := logfirst.OpenReadOnly(dir, noCheckpoint); err == nil || !strings.Contains(err.Error(), "layout version") {
		t.Fatalf("OpenReadOnly of a file of layout version 254 = %v, want a refusal naming the layout version", err)
	}
	if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
		t.Fatalf("a refused Open changed the data directory (-before +after):\n%s", diff)
	}
}

// A checkpoint whose bbolt commit fails the Linux way leaves its pages,
// the meta page included, in the page cache only. A restart without a
// reboot reads that checkpoint, removes the log segments below it and
// builds later checkpoints on those pages; after a power cut the store
// must still open and hold every acknowledged write, not a file whose
// meta page points at pages that were never written, nor a log gap.
func TestFailedCheckpointSync_RestartWithoutARebootThenAPowerCut(t *testing.T) {
	for seed := range uint64(20) {
		ffs, dir, opts, s := openOnFaultFS(t)
		// Enough for many leaf pages, which the checkpoint after the
		// restart does not touch.
		writeStream(t, s, "a", 150)
		failSyncOf(ffs, faultfs.OpCommit, filepath.Join(dir, logfirst.DBFile))
		if err := logfirst.CheckpointNow(s); !errors.Is(err, store.ErrFailed) {
			t.Fatalf("checkpoint whose commit fails = %v, want store.ErrFailed", err)
		}
		logfirst.Abandon(s)

		s, err := logfirst.Open(dir, opts) // no Crash: the page cache serves the checkpoint
		if err != nil {
			t.Fatalf("seed %d: Open after the failed checkpoint: %v", seed, err)
		}
		checkStream(t, s, "a", 150, "after the restart")
		writeStream(t, s, "b", 5)
		if err := logfirst.CheckpointNow(s); err != nil {
			t.Fatalf("checkpoint after the restart: %v", err)
		}
		logfirst.Abandon(s)

		if err := ffs.Crash(rand.New(rand.NewPCG(seed, 26))); err != nil {
			t.Fatal(err)
		}
		s, err = logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("seed %d: Open after the power cut: %v", seed, err)
		}
		checkStream(t, s, "a", 150, fmt.Sprintf("seed %d: after the power cut", seed))
		checkStream(t, s, "b", 5, fmt.Sprintf("seed %d: after the power cut", seed))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A start whose log's only segment holds no record (the last start wrote
// nothing, and removed the segments its checkpoint covered), under a
// journaling file system's crash model (creates and removes reach the disk
// in order, any prefix of them): a power cut at every call of that start
// leaves a store that opens with every write, never wal/ without a segment
// beside wal.created (ErrLogLost).
func TestOpen_AnEmptyOnlySegmentSurvivesACutAtEveryCallOfTheStart(t *testing.T) {
	setup := func() (*faultfs.FS, string, logfirst.Options) {
		ffs := faultfs.New()
		ffs.SetJournaled(true)
		dir := t.TempDir()
		opts := noCheckpoint
		opts.FS = ffs
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		fill(t, s, 5)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// This start checkpoints nothing new and removes the segment the
		// last checkpoint covered: one segment, empty, is left.
		s, err = logfirst.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		if n := logfirst.Segments(s); n != 1 {
			t.Fatalf("segments after a start with nothing to replay = %d, want 1", n)
		}
		logfirst.Abandon(s)
		return ffs, dir, opts
	}
	ffs, dir, opts := setup()
	start := ffs.Ops()
	s, err := logfirst.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	logfirst.Abandon(s)
	calls := ffs.Ops() - start
	for seed := range uint64(2) { // the cut between a remove and a create keeps the remove alone half the time
		rng := rand.New(rand.NewPCG(seed, 27))
		for at := range calls + 1 {
			ffs, dir, opts := setup()
			ffs.SetRule(faultfs.CutAt(ffs.Ops() + at))
			if s, err := logfirst.Open(dir, opts); err == nil {
				logfirst.Abandon(s)
			}
			if err := ffs.Crash(rng); err != nil {
				t.Fatal(err)
			}
			s, err := logfirst.Open(dir, opts)
			if err != nil {
				t.Fatalf("cut at call %d of the start: Open after the power cut: %v", at, err)
			}
			if entries, v := readAll(t, s); len(entries) != 5 || v != 5 {
				t.Fatalf("cut at call %d of the start: %d entries, value %d; want 5 and 5", at, len(entries), v)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A start that recovers (replays a log the checkpoint does not cover,
// and after a failed checkpoint sync first writes the bbolt file over
// itself and then removes the sync.failed marker) is cut by a power
// failure at every one of its calls: the start after that holds every
// acknowledged write.
func TestOpen_ARecoveringStartSurvivesACutAtEveryCall(t *testing.T) {
	const n = 40
	for _, failedCheckpoint := range []bool{false, true} {
		setup := func() (*faultfs.FS, string, logfirst.Options) {
			ffs, dir, opts, s := openOnFaultFS(t)
			fill(t, s, n)
			if failedCheckpoint {
				failSyncOf(ffs, faultfs.OpCommit, filepath.Join(dir, logfirst.DBFile))
				if err := logfirst.CheckpointNow(s); !errors.Is(err, store.ErrFailed) {
					t.Fatalf("checkpoint whose commit fails = %v, want store.ErrFailed", err)
				}
				ffs.SetRule(nil)
			}
			logfirst.Abandon(s) // no Crash: the next start is a restart from the page cache
			return ffs, dir, opts
		}
		ffs, dir, opts := setup()
		start := ffs.Ops()
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		logfirst.Abandon(s)
		calls := ffs.Ops() - start
		rng := rand.New(rand.NewPCG(uint64(calls), 28))
		for at := range calls + 1 {
			ffs, dir, opts := setup()
			ffs.SetRule(faultfs.CutAt(ffs.Ops() + at))
			if s, err := logfirst.Open(dir, opts); err == nil {
				logfirst.Abandon(s)
			}
			if err := ffs.Crash(rng); err != nil {
				t.Fatal(err)
			}
			s, err := logfirst.Open(dir, opts)
			if err != nil {
				t.Fatalf("failed checkpoint %v, cut at call %d of %d of the start: Open after the power cut: %v", failedCheckpoint, at, calls, err)
			}
			if entries, v := readAll(t, s); len(entries) != n || v != n {
				t.Fatalf("failed checkpoint %v, cut at call %d of %d of the start: %d entries, value %d; want %d and %d", failedCheckpoint, at, calls, len(entries), v, n, n)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("failed checkpoint %v: cut at each of the start's %d calls", failedCheckpoint, calls)
	}
}

// A sync that fails the Linux way at every log fdatasync and bbolt
// commit of a recovering start (as in
// TestOpen_ARecoveringStartSurvivesACutAtEveryCall), then a restart
// without a reboot, then a power cut: the start after that holds every
// acknowledged write.
func TestOpen_ARecoveringStartSurvivesAFailedSyncAtEveryCall(t *testing.T) {
	const n = 40
	for _, failedCheckpoint := range []bool{false, true} {
		setup := func() (*faultfs.FS, string, logfirst.Options) {
			ffs, dir, opts, s := openOnFaultFS(t)
			fill(t, s, n)
			if failedCheckpoint {
				failSyncOf(ffs, faultfs.OpCommit, filepath.Join(dir, logfirst.DBFile))
				if err := logfirst.CheckpointNow(s); !errors.Is(err, store.ErrFailed) {
					t.Fatalf("checkpoint whose commit fails = %v, want store.ErrFailed", err)
				}
				ffs.SetRule(nil)
			}
			logfirst.Abandon(s)
			return ffs, dir, opts
		}
		ffs, dir, opts := setup()
		start := ffs.Ops()
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		logfirst.Abandon(s)
		calls := ffs.Ops() - start
		rng := rand.New(rand.NewPCG(uint64(calls), 30))
		failed := 0
		for at := range calls {
			ffs, dir, opts := setup()
			first := ffs.Ops() + at
			var failedOp faultfs.Op
			ffs.SetRule(func(op faultfs.Op) faultfs.Action {
				if op.Index == first && (op.Kind == faultfs.OpSync || op.Kind == faultfs.OpCommit || op.Kind == faultfs.OpSyncDir) {
					failedOp = op
					return faultfs.FailSync
				}
				return faultfs.None
			})
			if s, err := logfirst.Open(dir, opts); err == nil {
				logfirst.Abandon(s)
			}
			ffs.SetRule(nil)
			if failedOp.Kind == 0 && failedOp.Path == "" {
				continue // not a sync
			}
			failed++
			// The restart without a reboot, then the power cut.
			s, err := logfirst.Open(dir, opts)
			if err != nil {
				t.Fatalf("failed checkpoint %v, failed %v: restart: %v", failedCheckpoint, failedOp, err)
			}
			logfirst.Abandon(s)
			if err := ffs.Crash(rng); err != nil {
				t.Fatal(err)
			}
			s, err = logfirst.Open(dir, opts)
			if err != nil {
				t.Fatalf("failed checkpoint %v, failed %v: Open after the power cut: %v", failedCheckpoint, failedOp, err)
			}
			if entries, v := readAll(t, s); len(entries) != n || v != n {
				t.Fatalf("failed checkpoint %v, failed %v: %d entries, value %d; want %d and %d", failedCheckpoint, failedOp, len(entries), v, n, n)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("failed checkpoint %v: a failed sync at each of the start's %d syncs", failedCheckpoint, failed)
	}
}

// The rewrite a sync.failed marker asks for happens under the data file's
// lock: a second process (an offline tool run beside the server) is
// refused store.ErrLocked and leaves the file the server serves as it is.
func TestOpen_TheRewriteAfterAFailedSyncWaitsForTheLock(t *testing.T) {
	dir := t.TempDir()
	st, err := logfirst.Open(dir, logfirst.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := os.WriteFile(filepath.Join(dir, logfirst.SyncFailedFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, logfirst.DBFile)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := logfirst.Open(dir, logfirst.Options{LockTimeout: 50 * time.Millisecond}); !errors.Is(err, store.ErrLocked) {
		t.Fatalf("a second Open beside a live store = %v, want store.ErrLocked", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(old) {
		t.Errorf("the refused Open wrote the live store's file (modified %v, was %v)", fi.ModTime(), old)
	}
}

// A checkpoint whose bbolt commit fails the Linux way, the process killed
// at every step after the failure (only the first `after` calls of the
// file system still run, the rest never happen: no marker if it comes
// after the failure), then a restart without a reboot, more writes and
// their checkpoint, then a power cut: the store opens and holds every
// acknowledged write. Without a marker the restart built on the page
// cache's pages of the failed commit.
func TestFailedCheckpointSync_KilledAtEveryStepAfterTheFailure(t *testing.T) {
	for after := range 3 {
		for seed := range uint64(10) {
			ffs, dir, opts, s := openOnFaultFS(t)
			writeStream(t, s, "a", 150)
			db := filepath.Join(dir, logfirst.DBFile)
			failed, left := false, after
			ffs.SetRule(func(op faultfs.Op) faultfs.Action {
				switch {
				case !failed && op.Kind == faultfs.OpCommit && op.Path == db:
					failed = true
					return faultfs.FailSync
				case failed && left == 0:
					return faultfs.Fail // killed: nothing more happens
				case failed:
					left--
				}
				return faultfs.None
			})
			if err := logfirst.CheckpointNow(s); !errors.Is(err, store.ErrFailed) {
				t.Fatalf("checkpoint whose commit fails = %v, want store.ErrFailed", err)
			}
			logfirst.Abandon(s)
			ffs.SetRule(nil)

			s, err := logfirst.Open(dir, opts) // no Crash: the page cache serves the checkpoint
			if err != nil {
				t.Fatalf("killed %d calls after, seed %d: Open after the failed checkpoint: %v", after, seed, err)
			}
			checkStream(t, s, "a", 150, "after the restart")
			writeStream(t, s, "b", 5)
			if err := logfirst.CheckpointNow(s); err != nil {
				t.Fatalf("checkpoint after the restart: %v", err)
			}
			logfirst.Abandon(s)

			if err := ffs.Crash(rand.New(rand.NewPCG(seed, 31))); err != nil {
				t.Fatal(err)
			}
			s, err = logfirst.Open(dir, opts)
			if err != nil {
				t.Fatalf("killed %d calls after the failed commit, seed %d: Open after the power cut: %v", after, seed, err)
			}
			when := fmt.Sprintf("killed %d calls after the failed commit, seed %d: after the power cut", after, seed)
			checkStream(t, s, "a", 150, when)
			checkStream(t, s, "b", 5, when)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// streamPayload is the i-th payload of stream in the failed-checkpoint
// tests: its name and index, then 200 bytes, so that a few hundred fill
// many leaf pages.
func streamPayload(stream string, i int) []byte {
	return append([]byte(fmt.Sprintf("%s%d:", stream, i)), bytes.Repeat([]byte{'x'}, 200)...)
}

// writeStream appends n payloads to stream, each flushed.
func writeStream(t *testing.T, s *logfirst.Store, stream string, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.Append(stream, streamPayload(stream, i), uint64(i)); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkStream fails t unless stream holds exactly its n payloads.
func checkStream(t *testing.T, s *logfirst.Store, stream string, n int, when string) {
	t.Helper()
	entries, err := s.ReadFrom(stream, 0, 0)
	if err != nil {
		t.Fatalf("%s: ReadFrom(%s): %v", when, stream, err)
	}
	if len(entries) != n {
		t.Fatalf("%s: stream %s holds %d entries, want %d", when, stream, len(entries), n)
	}
	for i, e := range entries {
		if !bytes.Equal(e.Payload, streamPayload(stream, i)) {
			t.Fatalf("%s: stream %s entry %d = %.20q", when, stream, i, e.Payload)
		}
	}
}
