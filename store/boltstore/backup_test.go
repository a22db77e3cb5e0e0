package boltstore_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store"
)

// TestBolt_Backup_CopiesEveryCommitAndNothingStaged backs up a store with
// flushed and staged writes: the copy opens as a store holding exactly the
// flushed ones, and its size is what begin announced.
func TestBolt_Backup_CopiesEveryCommitAndNothingStaged(t *testing.T) {
	dir := t.TempDir()
	b := openBolt(t, filepath.Join(dir, "data.db"))
	for seq := range uint64(50) {
		if _, err := b.Append("s", []byte(fmt.Sprintf("entry %d", seq)), seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.CAS("k", 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := b.PutBytes([]store.Bytes{{Key: "ck", Value: []byte("checkpoint")}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Append("s", []byte("staged"), 50); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var announced int64
	n, err := b.Backup(&buf, func(size int64) { announced = size })
	if err != nil {
		t.Fatalf("Backup error: %v", err)
	}
	if n != int64(buf.Len()) || n != announced {
		t.Fatalf("Backup wrote %d bytes (buffer %d), announced %d", n, buf.Len(), announced)
	}
	path := filepath.Join(dir, "copy.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	c := openBolt(t, path)
	if got, err := c.Len("s"); err != nil || got != 50 {
		t.Fatalf("copy Len(s) = %d, %v, want 50 (the staged append is not in a backup)", got, err)
	}
	entries, err := c.ReadFrom("s", 49, 0)
	if err != nil || len(entries) != 1 || string(entries[0].Payload) != "entry 49" {
		t.Fatalf("copy ReadFrom(s, 49) = %v, %v", entries, err)
	}
	if v, err := c.ReadValue("k"); err != nil || v != 7 {
		t.Fatalf("copy ReadValue(k) = %d, %v, want 7", v, err)
	}
	if v, err := c.GetBytes("ck"); err != nil || string(v) != "checkpoint" {
		t.Fatalf("copy GetBytes(ck) = %q, %v", v, err)
	}
	// The source keeps serving.
	if err := b.Flush(); err != nil {
		t.Fatalf("Flush after Backup: %v", err)
	}
}
