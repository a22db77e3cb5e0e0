package boltfmt

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func openLaidOut(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "data.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(InitLayout); err != nil {
		t.Fatal(err)
	}
	return db
}

func readAll(t *testing.T, db *bolt.DB, stream string) [][]byte {
	t.Helper()
	var got [][]byte
	if err := db.View(func(tx *bolt.Tx) error {
		entries, _, _, err := ReadPageTx(tx, stream, 0, 1<<20, 0, 0, nil, nil)
		for _, e := range entries {
			got = append(got, e.Payload)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// An owned payload is sealed where it lies: the bytes past its length
// become its checksum and bbolt stores the payload's own array, so that
// a checkpoint holds no copy of what it writes. What is read back
// verifies against the same checksum.
func TestPutOwnedEntries_SealsInPlace(t *testing.T) {
	db := openLaidOut(t)
	var payloads [][]byte
	for i := range 3 {
		p := make([]byte, 0, 100+SumLen)
		p = fmt.Appendf(p, "row %d %s", i, bytes.Repeat([]byte{'x'}, 64))
		payloads = append(payloads, p)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return PutOwnedEntries(tx, "s", 0, payloads) }); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, db, "s")
	if len(got) != len(payloads) {
		t.Fatalf("read %d entries, want %d", len(got), len(payloads))
	}
	for i, p := range payloads {
		if !bytes.Equal(got[i], p) {
			t.Fatalf("entry %d = %q, want %q", i, got[i], p)
		}
		sealed := seal(sumStreams, entryKey("s", uint64(i)), p)
		if inPlace := p[:len(p)+SumLen]; !bytes.Equal(inPlace, sealed) {
			t.Fatalf("entry %d: the payload's spare bytes hold %x, want its checksum %x: it was copied, not sealed in place", i, inPlace[len(p):], sealed[len(p):])
		}
	}
}

// A payload sliced from a bigger array shares it with whatever follows:
// PutEntries, and PutOwnedEntries given a capped slice, never write past
// its length.
func TestPutEntries_NeverWritesPastAPayload(t *testing.T) {
	for _, owned := range []bool{false, true} {
		t.Run(fmt.Sprintf("owned=%v", owned), func(t *testing.T) {
			db := openLaidOut(t)
			backing := []byte("first|second|third")
			before := bytes.Clone(backing)
			payloads := [][]byte{backing[0:5], backing[6:12], backing[13:]}
			put := PutEntries
			if owned {
				for i, p := range payloads {
					payloads[i] = p[:len(p):len(p)]
				}
				put = PutOwnedEntries
			}
			if err := db.Update(func(tx *bolt.Tx) error { return put(tx, "s", 0, payloads) }); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(backing, before) {
				t.Fatalf("the shared array became %q, want %q untouched", backing, before)
			}
			if got := readAll(t, db, "s"); len(got) != 3 || string(got[1]) != "second" {
				t.Fatalf("read back %q", got)
			}
		})
	}
}
