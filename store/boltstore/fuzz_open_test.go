package boltstore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store"
)

// FuzzOpenReadOnly opens any bytes as a data file, read-only, and reads
// it all: Open and Check either succeed or fail, and never crash or hang
// the process. Inputs are whole files (tens of KiB), which the fuzzer
// minimizes slowly: run it with -fuzzminimizetime 1x (make fuzz does).
func FuzzOpenReadOnly(f *testing.F) { fuzzOpen(f, true) }

// FuzzOpen is FuzzOpenReadOnly for a read-write open, in which bbolt walks
// every page.
func FuzzOpen(f *testing.F) { fuzzOpen(f, false) }

func fuzzOpen(f *testing.F, readOnly bool) {
	// One seed without a persisted freelist (Open walks every page) and
	// one with (Open reads the freelist and the structure above the
	// leaves, and bbolt only what it touches).
	for _, persist := range []bool{false, true} {
		path := filepath.Join(f.TempDir(), "seed.db")
		b, err := Open(path, Options{PersistFreelist: persist})
		if err != nil {
			f.Fatal(err)
		}
		for i := uint64(0); i < 60; i++ {
			if _, err := b.Append("s", bytes.Repeat([]byte{'v'}, 300), i); err != nil {
				f.Fatal(err)
			}
			if i%20 == 19 {
				if err := b.Flush(); err != nil {
					f.Fatal(err)
				}
			}
		}
		if err := b.CAS("k", 0, 1); err != nil {
			f.Fatal(err)
		}
		if err := b.Flush(); err != nil {
			f.Fatal(err)
		}
		b.Close()
		raw, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "data.db")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := Open(p, Options{ReadOnly: readOnly, LockTimeout: 1})
		if err != nil {
			return
		}
		defer b.Close()
		if err := b.Check(); err != nil && !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Check error %v does not wrap store.ErrCorrupt", err)
		}
	})
}
