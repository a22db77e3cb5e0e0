package logfirst_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/logfirst"
)

// compactState is what a trim and byte values leave visible.
type compactState struct {
	First   uint64
	Len     uint64
	Entries []store.Entry
	Bytes   map[string]string
}

func readCompactState(t *testing.T, s *logfirst.Store) compactState {
	t.Helper()
	first, err := s.First("s")
	if err != nil {
		t.Fatalf("First: %v", err)
	}
	n, err := s.Len("s")
	if err != nil {
		t.Fatalf("Len: %v", err)
	}
	entries, err := s.ReadFrom("s", first, 0)
	if err != nil {
		t.Fatalf("ReadFrom(%d): %v", first, err)
	}
	if _, err := s.ReadFrom("s", first-1, 1); first > 0 && !errors.Is(err, store.ErrCompacted) {
		t.Fatalf("ReadFrom(%d) = %v, want ErrCompacted", first-1, err)
	}
	out := compactState{First: first, Len: n, Entries: entries, Bytes: map[string]string{}}
	for _, k := range []string{"a", "b", "c"} {
		v, err := s.GetBytes(k)
		if err != nil {
			t.Fatalf("GetBytes(%q): %v", k, err)
		}
		if v != nil {
			out.Bytes[k] = string(v)
		}
	}
	return out
}

// boltFirst reads the first entry of "s" stored in the bbolt file.
func boltFirst(t *testing.T, dir string) (uint64, []byte) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, logfirst.DBFile), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var first uint64
	var b []byte
	if err := db.View(func(tx *bolt.Tx) error {
		if first, err = boltfmt.StreamFirst(tx, "s"); err != nil {
			return err
		}
		b, err = boltfmt.GetBytesTx(tx, "a")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return first, b
}

// Trims and byte values are log records like every write: replayed into
// memory by a read-only open, into bbolt by Open after a crash, and
// applied to bbolt by a checkpoint, with the trimmed range gone for good.
func TestTrimAndBytes_GoThroughTheLog(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, noCheckpoint)
	fill(t, s, 20)
	// Half the entries are checkpointed, the rest only logged: the trim
	// covers both layers.
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 30; i++ {
		if _, err := s.Append("s", []byte{byte(i)}, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Trim("s", 25); err != nil {
		t.Fatalf("Trim: %v", err)
	}
	if err := s.PutBytes([]store.Bytes{{Key: "a", Value: []byte("one")}, {Key: "b", Value: []byte("two")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.PutBytes([]store.Bytes{{Key: "b"}, {Key: "c", Value: []byte("three")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	want := readCompactState(t, s)
	if want.First != 25 || want.Len != 30 || len(want.Entries) != 5 || len(want.Bytes) != 2 {
		t.Fatalf("state before the crash = %+v", want)
	}
	logfirst.Abandon(s)
	if first, a := boltFirst(t, dir); first != 0 || a != nil {
		t.Fatalf("bbolt before replay: first %d, a %q; want the trim and bytes only in the log", first, a)
	}

	ro, err := logfirst.OpenReadOnly(dir, noCheckpoint)
	if err != nil {
		t.Fatalf("OpenReadOnly: %v", err)
	}
	if diff := cmp.Diff(want, readCompactState(t, ro)); diff != "" {
		t.Errorf("read-only replay (-want +got):\n%s", diff)
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir, noCheckpoint)
	if diff := cmp.Diff(want, readCompactState(t, s)); diff != "" {
		t.Errorf("after replay (-want +got):\n%s", diff)
	}
	logfirst.Abandon(s)
	if first, a := boltFirst(t, dir); first != 25 || string(a) != "one" {
		t.Fatalf("bbolt after replay: first %d, a %q; want 25, one", first, a)
	}
	// Reopened again, nothing is replayed and the trimmed range is still
	// gone; a further trim is checkpointed with the entries it follows.
	s = open(t, dir, noCheckpoint)
	if diff := cmp.Diff(want, readCompactState(t, s)); diff != "" {
		t.Errorf("after a second open (-want +got):\n%s", diff)
	}
	if err := s.Trim("s", 28); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := logfirst.CheckpointNow(s); err != nil {
		t.Fatal(err)
	}
	want.First, want.Entries = 28, want.Entries[3:]
	if diff := cmp.Diff(want, readCompactState(t, s)); diff != "" {
		t.Errorf("after a checkpointed trim (-want +got):\n%s", diff)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if first, _ := boltFirst(t, dir); first != 28 {
		t.Fatalf("bbolt after the checkpoint: first %d, want 28", first)
	}
}

func TestTrim_RefusesEntriesNotYetLogged(t *testing.T) {
	s := open(t, t.TempDir(), noCheckpoint)
	fill(t, s, 3)
	if _, err := s.Append("s", []byte("x"), 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Trim("s", 3); !errors.Is(err, store.ErrTrimRange) {
		t.Fatalf("Trim of the last logged entry = %v, want ErrTrimRange", err)
	}
	if err := s.Trim("s", 2); err != nil {
		t.Fatalf("Trim(2) = %v", err)
	}
}
