package logfirst_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/logfirst/logfirsttest"
)

// A new data directory's entries, the log directory and the bbolt file,
// are durable before any write is acknowledged: a power cut, under
// faultfs's model where a new directory entry survives only once its
// parent is synced, loses no flushed batch, whether the batches are only
// in the log or checkpointed into bbolt with the segments below them
// removed.
func TestOpen_ANewDataDirectorySurvivesAPowerCut(t *testing.T) {
	for _, checkpoint := range []bool{false, true} {
		ffs, dir, opts, s := openOnFaultFS(t)
		fill(t, s, 40)
		if checkpoint {
			if err := logfirst.CheckpointNow(s); err != nil {
				t.Fatalf("checkpoint: %v", err)
			}
		}
		logfirst.Abandon(s)
		if err := ffs.Crash(nil); err != nil {
			t.Fatalf("Crash: %v", err)
		}
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("checkpoint=%v: Open after the power cut: %v", checkpoint, err)
		}
		entries, v := readAll(t, s)
		if len(entries) != 40 || v != 40 {
			t.Errorf("checkpoint=%v: after the power cut %d entries and value %d, want 40 and 40", checkpoint, len(entries), v)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
}

// A log that was made durable in a directory and then lost, the directory
// or every segment in it, is refused ErrLogLost rather than started anew
// after the checkpoint; a bbolt file alone in a new directory (a restore)
// starts a new log.
func TestOpen_RefusesALostLog(t *testing.T) {
	for _, lose := range logfirsttest.Losses {
		dir := t.TempDir()
		s := open(t, dir, noCheckpoint)
		fill(t, s, 5)
		logfirst.Abandon(s)
		logfirsttest.LoseLog(t, dir, lose)
		if _, err := logfirst.Open(dir, noCheckpoint); !errors.Is(err, logfirst.ErrLogLost) || !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("lost %s: Open = %v, want ErrLogLost (store.ErrCorrupt)", lose, err)
		}
		if _, err := logfirst.OpenReadOnly(dir, noCheckpoint); !errors.Is(err, logfirst.ErrLogLost) {
			t.Fatalf("lost %s: OpenReadOnly = %v, want ErrLogLost", lose, err)
		}
	}

	// A restore: the bbolt file (a backup) alone in a new directory.
	src := t.TempDir()
	s := open(t, src, noCheckpoint)
	fill(t, s, 5)
	var backup bytes.Buffer
	if _, err := s.Backup(&backup, nil); err != nil {
		t.Fatalf("Backup: %v", err)
	}
	dst := t.TempDir()
	if err := os.WriteFile(filepath.Join(dst, logfirst.DBFile), backup.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	r := open(t, dst, noCheckpoint)
	if entries, v := readAll(t, r); len(entries) != 5 || v != 5 {
		t.Fatalf("restored: %d entries, value %d; want 5 and 5", len(entries), v)
	}
}
