package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/storetest"
)

// TestBolt_AppendOrderedBucketsArePackedFull: streams appended at their
// ends and receipts written in key order fill their pages instead of
// leaving each split page half empty.
func TestBolt_AppendOrderedBucketsArePackedFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.db")
	b, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	storetest.FillWorkload(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	storetest.CheckPacked(t, path)
}
