package boltfmt

import (
	"bytes"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// writeStore writes a data file at path as store/boltstore lays it out:
// n entries of payload in stream "s", perCommit of them to a write
// transaction, then, when withValue is set, value "k" = 7 in one more. The
// freelist is persisted or not, as Options.PersistFreelist does.
func writeStore(tb testing.TB, path string, persist bool, n, perCommit int, payload []byte, withValue bool) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{FreelistType: bolt.FreelistMapType, NoFreelistSync: !persist})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(InitLayout); err != nil {
		tb.Fatal(err)
	}
	for first := 0; first < n; first += perCommit {
		batch := make([][]byte, min(perCommit, n-first))
		for i := range batch {
			batch[i] = payload
		}
		if err := db.Update(func(tx *bolt.Tx) error { return PutEntries(tx, "s", uint64(first), batch) }); err != nil {
			tb.Fatal(err)
		}
	}
	if withValue {
		if err := db.Update(func(tx *bolt.Tx) error { return PutValue(tx, "k", 7) }); err != nil {
			tb.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
}

// writeFile makes a closed data file of many leaf pages in several
// commits (so that pages were freed), its freelist persisted or not, and
// returns its path.
func writeFile(t *testing.T, persist bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.db")
	writeStore(t, path, persist, 6000, 500, bytes.Repeat([]byte("p"), 200), true)
	return path
}

// chosenMeta returns the meta page bbolt would use for the file at path.
func chosenMeta(t *testing.T, path string) boltMeta {
	t.Helper()
	state, m, err := checkFile(path)
	if err != nil || state != fileValid {
		t.Fatalf("checkFile = %v, %v", state, err)
	}
	return m
}

// A file with a persisted freelist is opened for writing after reading its
// structure only: the branch pages, not the leaves, which are nearly all
// of it. A walk of every page still finds it whole.
func TestWalk_PersistedFreelistReadsTheStructureOnly(t *testing.T) {
	path := writeFile(t, true)
	m := chosenMeta(t, path)
	if m.freelist == noFreelist {
		t.Fatal("a file written with PersistFreelist has no freelist")
	}
	if got := walkModeFor(m); got != walkStructure {
		t.Fatalf("walkModeFor = %v, want walkStructure", got)
	}
	all, err := walkPages(path, m, walkAll)
	if err != nil {
		t.Fatalf("walkAll = %v", err)
	}
	some, err := walkPages(path, m, walkStructure)
	if err != nil {
		t.Fatalf("walkStructure = %v", err)
	}
	if some*10 > all {
		t.Errorf("walkStructure read %d pages, walkAll %d: want under a tenth", some, all)
	}
	if got := walkModeFor(chosenMeta(t, writeFile(t, false))); got != walkAll {
		t.Errorf("walkModeFor a file without a freelist = %v, want walkAll: bbolt walks it", got)
	}
}
