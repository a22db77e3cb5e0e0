package logfirst_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
)

// freelistPersisted reports whether the meta page bbolt would use for the
// file at path names a persisted freelist (bbolt v1.5's meta layout: page
// size at 24, freelist page at 48, txid at 64; 2^64-1 is none).
func freelistPersisted(t *testing.T, path string) bool {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	ps := int(le.Uint32(raw[24:]))
	best, bestTx := raw[:ps], le.Uint64(raw[64:])
	if m := raw[ps : 2*ps]; le.Uint32(m[16:]) == 0xED0CDAED && le.Uint64(m[64:]) > bestTx {
		best = m
	}
	return le.Uint64(best[48:]) != ^uint64(0)
}

// A data directory whose bbolt file was written without a persisted
// freelist (by --store bbolt, or by a version before the log-first store
// persisted it) opens on the log-first store, which walks it once and
// writes the freelist; later opens read it. The file still opens on the
// bbolt store afterwards, and every open reads the same data.
func TestOpen_FileWithoutAFreelistOpensAndGetsOne(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, logfirst.DBFile)
	b, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, b, 20)
	wantEntries, wantV := readAll(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if freelistPersisted(t, path) {
		t.Fatal("boltstore.Open with default options persisted a freelist")
	}
	check := func(s store.DurableStore, how string) {
		t.Helper()
		entries, v := readAll(t, s)
		if diff := cmp.Diff(wantEntries, entries); diff != "" || v != wantV {
			t.Errorf("%s: value %d, want %d; entries (-want +got):\n%s", how, v, wantV, diff)
		}
	}
	for i := range 2 {
		s, err := logfirst.Open(dir, noCheckpoint)
		if err != nil {
			t.Fatalf("logfirst.Open #%d: %v", i+1, err)
		}
		check(s, "logfirst.Open")
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if !freelistPersisted(t, path) {
			t.Fatalf("after logfirst.Open #%d the file has no persisted freelist", i+1)
		}
	}
	b, err = boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatalf("boltstore.Open of a file with a persisted freelist: %v", err)
	}
	check(b, "boltstore.Open")
	if err := b.Check(); err != nil {
		t.Errorf("Check() = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// The checkpoint persists bbolt's freelist while it is small and stops
// once it lists more pages than the bound (each commit would write every
// id), then persists it again once it is back under: the file opens
// whole after either.
func TestCheckpoint_PersistsTheFreelistOnlyWhileItIsSmall(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, logfirst.DBFile)
	s := open(t, dir, noCheckpoint)
	n := 0
	checkpoint := func(bound int) bool {
		t.Helper()
		defer logfirst.SetMaxPersistedFreePages(bound)()
		for range 50 {
			if _, err := s.Append("s", make([]byte, 300), uint64(n)); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := logfirst.CheckpointNow(s); err != nil {
			t.Fatal(err)
		}
		return freelistPersisted(t, path)
	}
	if !checkpoint(1 << 20) {
		t.Fatal("a checkpoint under the bound did not persist the freelist")
	}
	if checkpoint(0) {
		t.Fatal("a checkpoint with more free pages than the bound persisted the freelist")
	}
	if !checkpoint(1 << 20) {
		t.Fatal("a checkpoint back under the bound did not persist the freelist")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, noCheckpoint)
	defer s.Close()
	entries, err := s.ReadFrom("s", 0, 0)
	if err != nil || len(entries) != n {
		t.Fatalf("after reopening: %d entries, %v; want %d", len(entries), err, n)
	}
}
