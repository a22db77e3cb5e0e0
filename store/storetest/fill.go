package storetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// FillWorkload writes what a steady participantd workload writes to the
// append-ordered buckets: entries appended round-robin to several
// streams, flushed in small batches, each stream's oldest entries trimmed
// behind it, receipt-like byte values in ascending key order per
// conversation, and token index entries of UUIDv7 tokens (ascending time
// per scope, random below it). The store stays open; the caller closes it and checks the
// file with CheckPacked.
func FillWorkload(t *testing.T, st store.DurableStore) {
	t.Helper()
	cs, ok := store.AsCompactor(st)
	if !ok {
		t.Fatal("store is not a Compactor")
	}
	const streams, rounds, every, keep, payload = 8, 1200, 200, 300, 120
	p := bytes.Repeat([]byte("x"), payload)
	rnd := rand.New(rand.NewPCG(1, 2))
	for r := uint64(0); r < rounds; r++ {
		for s := 0; s < streams; s++ {
			if _, err := st.Append(fmt.Sprintf("oplog/%d", 1000+s), p, r); err != nil {
				t.Fatal(err)
			}
			for scope := range 2 {
				var tok [16]byte
				binary.BigEndian.PutUint64(tok[:8], (1_700_000_000_000+r)<<16|0x7000|rnd.Uint64()&0xfff)
				binary.BigEndian.PutUint64(tok[8:], 0x8000_0000_0000_0000|rnd.Uint64()>>2)
				if err := st.CAS(fmt.Sprintf("token/%d/%d/%x", 1000+s, scope, tok), 0, r+1); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := st.Flush(); err != nil {
			t.Fatal(err)
		}
		if r%every == every-1 {
			var receipts []store.Bytes
			for s := 0; s < streams; s++ {
				for i := r + 1 - every; i <= r; i++ {
					receipts = append(receipts, store.Bytes{Key: fmt.Sprintf("receipt/%d/%020d", 1000+s, i), Value: p[:60]})
				}
			}
			if err := cs.PutBytes(receipts); err != nil {
				t.Fatal(err)
			}
			if err := st.Flush(); err != nil {
				t.Fatal(err)
			}
			for s := 0; s < streams; s++ {
				if err := cs.Trim(fmt.Sprintf("oplog/%d", 1000+s), max(r, keep)-keep); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// CheckPacked fails t unless the leaf pages of the streams and bytes
// buckets of the closed bbolt file at path are at least 85% in use, and
// the values bucket's at least 70% (the token index of UUIDv7 tokens):
// keys written in ascending order must not leave half-empty pages behind
// (bbolt's default split does).
func CheckPacked(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for _, c := range []struct {
			name string
			fill float64
		}{{"streams", 0.85}, {"bytes", 0.85}, {"values", 0.70}} {
			b := tx.Bucket([]byte(c.name))
			if b == nil {
				return fmt.Errorf("no bucket %s", c.name)
			}
			s := b.Stats()
			if fill := float64(s.LeafInuse) / float64(s.LeafAlloc); s.LeafPageN < 10 || fill < c.fill {
				t.Errorf("bucket %s: %d leaf pages, %d of %d bytes in use (%.0f%%), want at least 10 pages at %.0f%%",
					c.name, s.LeafPageN, s.LeafInuse, s.LeafAlloc, 100*fill, 100*c.fill)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
