package boltstore_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store/boltstore"
)

// TestStore_LenOfAbsentStreamsKeepsNothing: see the same test of
// store/logfirst. A refused enroll asks the length of a stream that does
// not exist; the store must keep no state for it.
func TestStore_LenOfAbsentStreamsKeepsNothing(t *testing.T) {
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for i := range 1000 {
		if n, err := s.Len(fmt.Sprintf("oplog/%d", i)); n != 0 || err != nil {
			t.Fatalf("Len(absent stream) = %d, %v; want 0, nil", n, err)
		}
	}
	if n := s.CachedStreams(); n != 0 {
		t.Fatalf("after Len of 1,000 absent streams the store holds %d stream states, want 0", n)
	}
	if _, err := s.Append("oplog/1", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append("oplog/1", []byte("y"), 1); err != nil {
		t.Fatalf("second Append at seq 1: %v", err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Len("oplog/1"); n != 2 || err != nil {
		t.Fatalf("Len after two appends = %d, %v; want 2", n, err)
	}
	if n := s.CachedStreams(); n != 1 {
		t.Fatalf("the store holds %d stream states after appends to one stream, want 1", n)
	}
}
