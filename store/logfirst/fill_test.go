package logfirst_test

import (
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/storetest"
)

// TestLogFirst_CheckpointPacksAppendOrderedBucketsFull: the checkpoint
// writes streams and receipts into the bbolt file with full pages, as
// Bolt does.
func TestLogFirst_CheckpointPacksAppendOrderedBucketsFull(t *testing.T) {
	dir := t.TempDir()
	s, err := logfirst.Open(dir, logfirst.Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.FillWorkload(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	storetest.CheckPacked(t, filepath.Join(dir, "participantd.db"))
}
