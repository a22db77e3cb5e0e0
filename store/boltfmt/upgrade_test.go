package boltfmt

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// layout1File writes the golden version 1 data file of the log-first
// store's tests to a new path.
func layout1File(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "logfirst", "testdata", "layout1.db.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "participantd.db")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// everything reads every stream entry, value, byte value and meta value
// of tx through the readers of this package, as text.
func everything(t *testing.T, tx *bolt.Tx) []string {
	t.Helper()
	var out []string
	for _, s := range []string{"oplog/1", "outbox/1"} {
		if err := Entries(tx, s, 0, func(seq uint64, v []byte) bool {
			out = append(out, fmt.Sprintf("%s %d %q", s, seq, v))
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	vals, err := ScanValues(tx, "", func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vals {
		out = append(out, fmt.Sprintf("value %s %d", v.Key, v.Value))
	}
	b, err := GetBytesTx(tx, "checkpoint/1")
	if err != nil {
		t.Fatal(err)
	}
	m, err := ReadMeta(tx, "checkpoint_lsn")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, fmt.Sprintf("bytes %q", b), fmt.Sprintf("meta %x", m))
}

// An upgrade from version 1 cut after any of its transactions (a crash)
// leaves a file whose every value reads as before, whose every sealed
// value verifies (CheckKeys), and which the next upgrade step resumes:
// run here with a budget of a few values per transaction.
func TestUpgrade_EveryStepReadsTheSameAndResumes(t *testing.T) {
	defer func(n int) { upgradeBatchBytes = n }(upgradeBatchBytes)
	upgradeBatchBytes = 40
	path := layout1File(t)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var want []string
	if err := db.View(func(tx *bolt.Tx) error { want = everything(t, tx); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(want) < 10 {
		t.Fatalf("the golden file reads %q, want its content", want)
	}
	steps := 0
	for f := (format{version: 1}); f.version < LayoutVersion; steps++ {
		if err := db.Update(func(tx *bolt.Tx) error {
			var err error
			f, err = upgradeStep(tx, upgradeBatchBytes)
			return err
		}); err != nil {
			t.Fatalf("step %d: %v", steps, err)
		}
		if err := db.View(func(tx *bolt.Tx) error {
			if diff := cmp.Diff(want, everything(t, tx)); diff != "" {
				t.Errorf("after step %d (-before +after):\n%s", steps, diff)
			}
			return CheckKeys(tx)
		}); err != nil {
			t.Fatalf("CheckKeys after step %d: %v", steps, err)
		}
	}
	if steps < 4 {
		t.Errorf("the upgrade took %d transactions, want it split by the budget", steps)
	}
	// Sealed now: a changed byte of a value is refused where it once
	// was served.
	if err := db.Update(func(tx *bolt.Tx) error {
		k := entryKey("oplog/1", 5)
		v := append([]byte(nil), tx.Bucket(bucketStreams).Get(k)...)
		v[0] ^= 1
		return tx.Bucket(bucketStreams).Put(k, v)
	}); err != nil {
		t.Fatal(err)
	}
	var ce *store.ChecksumError
	err = db.View(func(tx *bolt.Tx) error { return Entries(tx, "oplog/1", 5, func(uint64, []byte) bool { return true }) })
	if !errors.As(err, &ce) || !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("Entries over a flipped byte = %v, want a *store.ChecksumError", err)
	}
	if err := db.View(CheckKeys); !errors.As(err, &ce) {
		t.Errorf("CheckKeys over a flipped byte = %v, want a *store.ChecksumError", err)
	}
}

// A value sealed under one key does not verify under another, nor in
// another bucket.
func TestSeal_KeyAndBucketAreInTheSum(t *testing.T) {
	path := filepath.Join(t.TempDir(), "participantd.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := InitLayout(tx); err != nil {
			return err
		}
		if err := PutValue(tx, "token/1/e/01", 4); err != nil {
			return err
		}
		vb := tx.Bucket(bucketValues)
		raw := vb.Get([]byte("token/1/e/01"))
		if err := vb.Put([]byte("token/1/e/02"), append([]byte(nil), raw...)); err != nil {
			return err
		}
		return tx.Bucket(bucketStreams).Put(entryKey("token/1/e/01", 0), append([]byte(nil), raw...))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		if v, err := ReadValueTx(tx, "token/1/e/01"); err != nil || v != 4 {
			t.Errorf("ReadValueTx(token/1/e/01) = %d, %v; want 4", v, err)
		}
		if v, err := ReadValueTx(tx, "token/1/e/02"); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("ReadValueTx of a value copied to another key = %d, %v; want ErrCorrupt", v, err)
		}
		if err := Entries(tx, "token/1/e/01", 0, func(uint64, []byte) bool { return true }); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("Entries of a value copied to the streams bucket = %v, want ErrCorrupt", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A bit flipped in a key leaves its entry in place under another key: a
// lookup of the key it had must not read it as absent (0, "never
// written": a token index entry lost, a retry decided again), nor a
// stream walk read past it. Flipped up and down in key order.
func TestSeal_AFlippedKeyIsDamageNotAbsence(t *testing.T) {
	for _, mask := range []byte{0x40, 0x10} {
		t.Run(fmt.Sprintf("%#x", mask), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "participantd.db")
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error {
				if err := InitLayout(tx); err != nil {
					return err
				}
				for i := range 6 {
					if err := PutValue(tx, fmt.Sprintf("token/1/e/%02d", i), uint64(i+1)); err != nil {
						return err
					}
				}
				return PutEntries(tx, "oplog/1", 0, [][]byte{[]byte("row0"), []byte("row1"), []byte("row2")})
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			at := bytesIndex(raw, []byte("token/1/e/03"))
			raw[at+len("token/1/e/03")-1] ^= mask
			last := bytesIndex(raw, entryKey("oplog/1", 2))
			raw[last+2] ^= mask // the stream's name in its last entry's key
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.View(func(tx *bolt.Tx) error {
				if v, err := ReadValueTx(tx, "token/1/e/03"); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("ReadValueTx of a flipped key = %d, %v; want ErrCorrupt", v, err)
				}
				if n, err := StreamLen(tx, "oplog/1"); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("StreamLen of a stream whose last key flipped = %d, %v; want ErrCorrupt", n, err)
				}
				if err := Entries(tx, "oplog/1", 0, func(uint64, []byte) bool { return true }); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("Entries over a flipped key = %v, want ErrCorrupt", err)
				}
				if err := CheckKeys(tx); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("CheckKeys = %v, want ErrCorrupt", err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			db.Close()
			// A write beside the flipped key would be put where bbolt's
			// search, misled by it, finds it no more: refused.
			if db, err = bolt.Open(path, 0o600, nil); err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error { return PutValue(tx, "token/1/e/03", 9) }); !errors.Is(err, store.ErrCorrupt) {
				t.Errorf("PutValue beside a flipped key = %v, want ErrCorrupt", err)
			}
		})
	}
}

// A bit flipped in a meta key (the log-first store's checkpoint LSN) is
// damage, not a key never written: ReadMeta reads it as ReadValueTx reads
// a value.
func TestSeal_AFlippedMetaKeyIsDamageNotAbsence(t *testing.T) {
	for _, mask := range []byte{0x40, 0x10} {
		t.Run(fmt.Sprintf("%#x", mask), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "participantd.db")
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error {
				if err := InitLayout(tx); err != nil {
					return err
				}
				return PutMeta(tx, "checkpoint_lsn", []byte{0, 0, 0, 0, 0, 0, 0, 7})
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			raw[bytesIndex(raw, []byte("checkpoint_lsn"))+len("checkpoint_lsn")-1] ^= mask
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.View(func(tx *bolt.Tx) error {
				if v, err := ReadMeta(tx, "checkpoint_lsn"); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("ReadMeta of a flipped key = %x, %v; want ErrCorrupt", v, err)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func bytesIndex(b, sub []byte) int {
	i := bytes.Index(b, sub)
	if i < 0 {
		panic(fmt.Sprintf("%q not found", sub))
	}
	return i
}

// A key flipped out of order in a file of version 1, whose values carry
// no checksum to tell, is damage to CheckKeys: bbolt's searches would
// step past it.
func TestCheckKeys_AKeyOutOfOrderInAnUnsealedFile(t *testing.T) {
	path := layout1File(t)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// "server/incarnation" becomes "zerver/incarnation", after the token
	// keys that follow it, in every copy the file holds.
	key := []byte("server/incarnation")
	n := bytes.Count(raw, key)
	for range n {
		raw[bytesIndex(raw, key)] ^= 's' ^ 'z'
	}
	if n == 0 {
		t.Fatalf("the golden file holds no %q", key)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(CheckKeys)
	if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "out of order") {
		t.Fatalf("CheckKeys over a key out of order = %v, want ErrCorrupt (out of order)", err)
	}
}
