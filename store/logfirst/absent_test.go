package logfirst_test

import (
	"fmt"
	"testing"

	"github.com/participantd/participantd/store/logfirst"
)

// TestStore_LenOfAbsentStreamsKeepsNothing asks the length of many streams
// that do not exist, as the refused enrolls of a hostile client do (the
// service checks that the conversation is stored nowhere before it refuses
// it), and checks that the store keeps no state for them: each would be a
// few hundred bytes that nothing ever frees. A stream that exists, or is
// appended to, keeps its state.
func TestStore_LenOfAbsentStreamsKeepsNothing(t *testing.T) {
	s := open(t, t.TempDir(), logfirst.Options{})
	for i := range 1000 {
		if n, err := s.Len(fmt.Sprintf("oplog/%d", i)); n != 0 || err != nil {
			t.Fatalf("Len(absent stream) = %d, %v; want 0, nil", n, err)
		}
	}
	if n := logfirst.CachedStreams(s); n != 0 {
		t.Fatalf("after Len of 1,000 absent streams the store holds %d stream states, want 0", n)
	}
	if _, err := s.Append("oplog/1", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Len("oplog/1"); n != 1 || err != nil {
		t.Fatalf("Len after an append = %d, %v; want 1", n, err)
	}
	if _, err := s.Append("oplog/1", []byte("y"), 1); err != nil {
		t.Fatalf("second Append at seq 1: %v", err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := logfirst.CachedStreams(s); n != 1 {
		t.Fatalf("the store holds %d stream states after appends to one stream, want 1", n)
	}
}
