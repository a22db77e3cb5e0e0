package logfirst_test

import (
	"bytes"
	"testing"

	"github.com/participantd/participantd/store/logfirst"
)

// InUse counts what bbolt holds after every checkpoint as a read of the
// file then does, though it reads no transaction itself: a checkpoint
// notes the file's pages when it commits.
func TestStore_InUseAfterACheckpoint_CountsWhatItWrote(t *testing.T) {
	s := open(t, t.TempDir(), noCheckpoint)
	check := func(when string) int64 {
		t.Helper()
		got, err := s.InUse()
		if err != nil {
			t.Fatalf("InUse %s: %v", when, err)
		}
		pages, err := logfirst.PagesNow(s)
		if err != nil {
			t.Fatalf("pages %s: %v", when, err)
		}
		if want := pages + logfirst.Uncheckpointed(s); got != want {
			t.Fatalf("InUse %s = %d, want %d (pages %d + logged %d)", when, got, want, pages, logfirst.Uncheckpointed(s))
		}
		return pages
	}
	before := check("at open")
	payload := bytes.Repeat([]byte{'x'}, 1024)
	for round := range 3 {
		for i := range 200 {
			if _, err := s.Append("s", payload, uint64(round*200+i)); err != nil {
				t.Fatalf("Append: %v", err)
			}
		}
		if err := s.Flush(); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		check("before a checkpoint")
		if err := logfirst.CheckpointNow(s); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		after := check("after a checkpoint")
		if after <= before {
			t.Fatalf("pages after checkpoint %d = %d, not above %d: the test wrote too little to show", round, after, before)
		}
		before = after
	}
}
