package logfirst_test

import (
	"testing"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store/logfirst"
)

// A new data directory's entries, the log directory and the bbolt file,
// are durable before any write is acknowledged: a power cut, under
// faultfs's model where a new directory entry survives only once its
// parent is synced, loses no flushed batch, whether the batches are only
// in the log or checkpointed into bbolt with the segments below them
// removed.
func TestOpen_ANewDataDirectorySurvivesAPowerCut(t *testing.T) {
	for _, checkpoint := range []bool{false, true} {
		ffs := faultfs.New()
		dir := t.TempDir()
		opts := noCheckpoint
		opts.FS = ffs
		s, err := logfirst.Open(dir, opts)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
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
		s, err = logfirst.Open(dir, opts)
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
