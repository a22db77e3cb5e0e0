package logfirst_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/wal"
)

// A checkpoint whose removal of the segments it covers fails at the log
// directory's sync, the Linux way (the directory's creates and removes
// marked clean unwritten, a later sync succeeding without them): the
// directory's state is unknown, and a segment the committer creates
// beside the checkpointer could be one of those entries. The store fails
// at once (store.ErrFailed, wal.ErrDirSync) and acknowledges nothing
// more; a restart without a reboot, more writes and their checkpoint,
// then a power cut: every acknowledged write is there.
func TestFailedDirSync_ACheckpointsRemovalFailsTheStore(t *testing.T) {
	for seed := range uint64(20) {
		ffs, dir, opts, s := openOnFaultFS(t)
		ffs.SetJournaled(seed%2 == 1)
		writeStream(t, s, "a", 60) // several segments of 4 KiB
		failSyncOf(ffs, faultfs.OpSyncDir, filepath.Join(dir, logfirst.WALDir))
		if err := logfirst.CheckpointNow(s); !errors.Is(err, store.ErrFailed) || !errors.Is(err, wal.ErrDirSync) {
			t.Fatalf("checkpoint whose segment removal fails at the directory sync = %v, want store.ErrFailed and wal.ErrDirSync", err)
		}
		ffs.SetRule(nil)
		if _, err := s.Append("a", streamPayload("a", 60), 60); !errors.Is(err, store.ErrFailed) {
			t.Fatalf("Append after the failed directory sync = %v, want store.ErrFailed", err)
		}
		logfirst.Abandon(s)

		s, err := logfirst.Open(dir, opts) // no Crash: the namespace shows the removals
		if err != nil {
			t.Fatalf("seed %d: Open after the failed directory sync: %v", seed, err)
		}
		checkStream(t, s, "a", 60, "after the restart")
		writeStream(t, s, "b", 30)
		if err := logfirst.CheckpointNow(s); err != nil {
			t.Fatalf("checkpoint after the restart: %v", err)
		}
		writeStream(t, s, "c", 30)
		logfirst.Abandon(s)

		if err := ffs.Crash(rand.New(rand.NewPCG(seed, 32))); err != nil {
			t.Fatal(err)
		}
		s, err = logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("seed %d: Open after the power cut: %v", seed, err)
		}
		for _, name := range []string{"a", "b", "c"} {
			n := 30
			if name == "a" {
				n = 60
			}
			checkStream(t, s, name, n, fmt.Sprintf("seed %d: after the power cut", seed))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// dirSyncLife is a store's life on ffs in dir: an Open, n writes to
// stream, each flushed, with a checkpoint (and the removal of the
// segments it covers) after every tenth, then an abandon (a kill). It
// stops at the first error, as a process whose store failed stops, and
// returns the writes acknowledged.
func dirSyncLife(ffs *faultfs.FS, dir string, stream string, n int) (int, error) {
	opts := noCheckpoint
	opts.FS = ffs
	s, err := logfirst.Open(dir, opts)
	if err != nil {
		return 0, err
	}
	defer logfirst.Abandon(s)
	for i := range n {
		if _, err := s.Append(stream, streamPayload(stream, i), uint64(i)); err != nil {
			return i, err
		}
		if err := s.Flush(); err != nil {
			return i, err
		}
		if i%10 == 9 {
			if err := logfirst.CheckpointNow(s); err != nil {
				return i + 1, err
			}
		}
	}
	return n, nil
}

// TestPowerCut_FailedDirSyncInAStoresLife fails, the Linux way, every
// sync of the data directory and of wal/ in a store's life in turn (the
// first start's: the bbolt file's entry, wal/'s, the first segment's,
// wal.created's; rotations; checkpoints' removals), the process going on
// until its store fails; then a restart without a reboot that
// acknowledges more writes, with rotations and a checkpoint; then a power
// cut. The store must open with every acknowledged write and its log
// marker (wal.created).
func TestPowerCut_FailedDirSyncInAStoresLife(t *testing.T) {
	const n = 60
	// The calls of a clean life that sync the data directory or wal/
	// (the bbolt file lives on the operating system's disk: a new
	// directory each time).
	var syncs []uint64
	clean := faultfs.New()
	cleanDir := t.TempDir()
	clean.SetRule(func(op faultfs.Op) faultfs.Action {
		if op.Kind == faultfs.OpSyncDir && (op.Path == cleanDir || op.Path == filepath.Join(cleanDir, logfirst.WALDir)) {
			syncs = append(syncs, op.Index)
		}
		return faultfs.None
	})
	if _, err := dirSyncLife(clean, cleanDir, "a", n); err != nil {
		t.Fatal(err)
	}
	for i, at := range syncs {
		dir := t.TempDir()
		ffs := faultfs.New()
		ffs.SetJournaled(i%2 == 1)
		var failedOp faultfs.Op
		ffs.SetRule(func(op faultfs.Op) faultfs.Action {
			if op.Index != at {
				return faultfs.None
			}
			if op.Kind != faultfs.OpSyncDir {
				t.Errorf("call %d of the life is %v, not the directory sync of the clean life", at, op)
			}
			failedOp = op
			return faultfs.FailSync
		})
		acked, err := dirSyncLife(ffs, dir, "a", n)
		ffs.SetRule(nil)
		if err != nil && !errors.Is(err, faultfs.ErrInjected) {
			t.Fatalf("failed %v: %v", failedOp, err)
		}
		// The restart without a reboot.
		if got, err := dirSyncLife(ffs, dir, "b", 25); err != nil || got != 25 {
			t.Fatalf("failed %v: restart: %d of 25 acknowledged, %v", failedOp, got, err)
		}
		if err := ffs.Crash(rand.New(rand.NewPCG(uint64(at), 33))); err != nil {
			t.Fatal(err)
		}
		// The marker guards the log: lost, a log lost after it would be
		// taken for a store that never had one.
		if _, err := ffs.Open(filepath.Join(dir, logfirst.LogMarkerFile)); err != nil {
			t.Fatalf("failed %v: after the power cut: %s: %v", failedOp, logfirst.LogMarkerFile, err)
		}
		opts := noCheckpoint
		opts.FS = ffs
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("failed %v: Open after the restart and a power cut: %v", failedOp, err)
		}
		a, err := s.ReadFrom("a", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(a) < acked {
			t.Fatalf("failed %v: stream a holds %d entries after the power cut, %d were acknowledged", failedOp, len(a), acked)
		}
		for i, e := range a {
			if !bytes.Equal(e.Payload, streamPayload("a", i)) {
				t.Fatalf("failed %v: stream a entry %d = %.20q", failedOp, i, e.Payload)
			}
		}
		checkStream(t, s, "b", 25, fmt.Sprintf("failed %v: after the power cut", failedOp))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(syncs) < 10 {
		t.Fatalf("a store's life synced its directories %d times; want more", len(syncs))
	}
	t.Logf("a failed directory sync at each of %d", len(syncs))
}
