package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
)

// writeFile makes a closed data file of many leaf pages in several
// commits (so that pages were freed), its freelist persisted or not, and
// returns its path.
func writeFile(t *testing.T, persist bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.db")
	b, err := Open(path, Options{PersistFreelist: persist})
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("p"), 200)
	for i := uint64(0); i < 6000; i++ {
		if _, err := b.Append("s", payload, i); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			if err := b.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.CAS("k", 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// chosenMeta returns the meta page bbolt would use for the file at path.
func chosenMeta(t *testing.T, path string) boltfmt.Meta {
	t.Helper()
	m, err := boltfmt.MetaOf(path)
	if err != nil {
		t.Fatalf("MetaOf = %v", err)
	}
	return m
}

// Offsets and flags of bbolt's file format the damage below needs.
const (
	leafFlag       = 0x02 // page header flags of a leaf page
	metaSumOffset  = 72   // a meta page's checksum
	pageHeaderSize = 16   // id, flags, count, overflow
)

// readAll returns the entries of stream s and the value of k.
func readAll(t *testing.T, path string, opts Options) ([]store.Entry, uint64) {
	t.Helper()
	b, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%+v) = %v", opts, err)
	}
	defer b.Close()
	entries, err := b.ReadFrom("s", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err := b.ReadValue("k")
	if err != nil {
		t.Fatal(err)
	}
	return entries, v
}

// A file written without a persisted freelist (every file before
// PersistFreelist, and every file of --store bbolt) opens with it and gets
// one at its next commit, and the other way round: the data is the same
// whichever way the file was last written.
func TestOpen_FilesWithAndWithoutAFreelistOpenEitherWay(t *testing.T) {
	for _, persisted := range []bool{false, true} {
		path := writeFile(t, persisted)
		wantEntries, wantV := readAll(t, path, Options{ReadOnly: true})
		for _, persist := range []bool{!persisted, persisted, !persisted} {
			entries, v := readAll(t, path, Options{PersistFreelist: persist})
			if !sameEntries(wantEntries, entries) || v != wantV {
				t.Fatalf("written with a freelist %v, opened with %v: %d entries and value %d, want the %d entries and value %d read before",
					persisted, persist, len(entries), v, len(wantEntries), wantV)
			}
			b, err := Open(path, Options{PersistFreelist: persist})
			if err != nil {
				t.Fatal(err)
			}
			var k2 uint64
			k2, err = b.ReadValue("k2")
			if err == nil {
				err = b.CAS("k2", k2, k2+1)
			}
			if err == nil {
				err = b.Flush()
			}
			if err == nil {
				err = b.Check()
			}
			if cerr := b.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatalf("commit and Check opened with a freelist %v: %v", persist, err)
			}
			if got := chosenMeta(t, path).Freelist != boltfmt.NoFreelist; got != persist {
				t.Errorf("after a commit with PersistFreelist %v, the meta names a freelist: %v", persist, got)
			}
		}
	}
}

// A persisted freelist that is damaged is refused before bbolt trusts it:
// an id it lists that is in use would let a commit overwrite live pages.
func TestOpen_DamagedFreelistIsErrCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(page []byte, m boltfmt.Meta)
	}{
		{"not a freelist page", func(page []byte, _ boltfmt.Meta) { binary.LittleEndian.PutUint16(page[8:], leafFlag) }},
		{"a free page in use (the root)", func(page []byte, m boltfmt.Meta) {
			ids := freeIDs(page)
			ids[len(ids)-1] = m.Root
			sortInto(page, ids)
		}},
		{"a free page past the high water mark", func(page []byte, m boltfmt.Meta) {
			ids := freeIDs(page)
			ids[len(ids)-1] = m.HighWater
			sortInto(page, ids)
		}},
		{"ids out of order", func(page []byte, _ boltfmt.Meta) {
			ids := freeIDs(page)
			ids[0], ids[1] = ids[1], ids[0]
			for i, id := range ids {
				binary.LittleEndian.PutUint64(page[pageHeaderSize+8*i:], id)
			}
		}},
		{"more ids than the page holds", func(page []byte, _ boltfmt.Meta) { binary.LittleEndian.PutUint16(page[10:], 4000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, true)
			m := chosenMeta(t, path)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			page := raw[m.Freelist*uint64(m.PageSize) : (m.Freelist+1)*uint64(m.PageSize)]
			if n := binary.LittleEndian.Uint16(page[10:]); n < 2 || n == 0xFFFF {
				t.Fatalf("the freelist lists %d pages, want a few to damage", n)
			}
			tc.damage(page, m)
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, persist := range []bool{true, false} {
				b, err := Open(path, Options{PersistFreelist: persist})
				if err == nil {
					b.Close()
				}
				if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
					t.Errorf("Open(PersistFreelist %v) = %v, want store.ErrCorrupt naming %s", persist, err, path)
				}
			}
			if err := boltfmt.CheckFile(path, true); !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("CheckFile = %v, want store.ErrCorrupt", err)
			}
		})
	}
}

func freeIDs(page []byte) []uint64 {
	ids := make([]uint64, binary.LittleEndian.Uint16(page[10:]))
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(page[pageHeaderSize+8*i:])
	}
	return ids
}

// sortInto writes ids back into the freelist page in ascending order.
func sortInto(page []byte, ids []uint64) {
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	for i, id := range ids {
		binary.LittleEndian.PutUint64(page[pageHeaderSize+8*i:], id)
	}
}

// sameEntries compares entries by seq and payload (cmp.Diff is slow on
// megabytes of payload).
func sameEntries(a, b []store.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Seq != b[i].Seq || !bytes.Equal(a[i].Payload, b[i].Payload) {
			return false
		}
	}
	return true
}

// A crash that tears the newest meta page of a file with a persisted
// freelist leaves bbolt on the previous meta and that meta's freelist,
// which the last commit did not overwrite (bbolt frees a freelist page
// only in the commit after the one that wrote it): the file opens for
// writing, as it was before that commit, and stays whole.
func TestOpen_PersistedFreelistOfThePreviousMetaAfterATornCommit(t *testing.T) {
	path := writeFile(t, true)
	b, err := Open(path, Options{PersistFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append("s", []byte("last"), 6000); err != nil {
		t.Fatal(err)
	}
	if err := b.CAS("k", 7, 8); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := chosenMeta(t, path)
	newest := uint64(0)
	if p1, err := boltfmt.ParseMeta(raw[m.PageSize:]); err == nil && p1.TxID == m.TxID {
		newest = 1
	}
	raw[newest*uint64(m.PageSize)+metaSumOffset] ^= 0xff // as a torn write leaves it
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if prev := chosenMeta(t, path); prev.TxID >= m.TxID || prev.Freelist == boltfmt.NoFreelist {
		t.Fatalf("after tearing meta txid %d, bbolt would use txid %d (freelist page %d)", m.TxID, prev.TxID, prev.Freelist)
	}
	for _, persist := range []bool{true, false} {
		entries, v := readAll(t, path, Options{PersistFreelist: persist})
		if len(entries) != 6000 || v != 7 {
			t.Fatalf("opened with a freelist %v: %d entries, k = %d; want the 6000 entries and k = 7 of the previous commit", persist, len(entries), v)
		}
	}
	b, err = Open(path, Options{PersistFreelist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Check(); err != nil {
		t.Errorf("Check() = %v", err)
	}
}
