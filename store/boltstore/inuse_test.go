package boltstore_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// InUse falls when a trim frees pages, while the file's size does not:
// bbolt keeps the freed pages for later writes.
func TestBolt_InUse_FallsAfterTrim(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.db")
	b := openBolt(t, path)
	payload := bytes.Repeat([]byte("p"), 4<<10)
	const n = 512
	for i := uint64(0); i < n; i++ {
		if _, err := b.Append("s", payload, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	full, err := b.InUse()
	if err != nil {
		t.Fatal(err)
	}
	if full < n*int64(len(payload)) {
		t.Fatalf("InUse() = %d after %d payloads of %d bytes, want at least %d", full, n, len(payload), n*len(payload))
	}
	if err := b.Trim("s", n-1); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	trimmed, err := b.InUse()
	if err != nil {
		t.Fatal(err)
	}
	if trimmed > full/8 {
		t.Errorf("InUse() = %d after trimming all but one of %d payloads (was %d), want at most %d", trimmed, n, full, full/8)
	}
	if fi.Size() < full {
		t.Errorf("file size %d below the bytes that were in use, %d: the test no longer shows the difference", fi.Size(), full)
	}
}
