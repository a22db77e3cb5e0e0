package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLayout_RecordedOnceThenReused: a new directory gets a layout on
// loopback, recorded; a second call returns the same one as existing.
func TestLayout_RecordedOnceThenReused(t *testing.T) {
	dir := t.TempDir()
	first, existing, err := loadOrCreateLayout(dir, 3)
	if err != nil || existing || len(first.Members) != 3 {
		t.Fatalf("first = %+v, existing %v, %v; want 3 new members", first, existing, err)
	}
	for _, m := range first.Members {
		if !strings.HasPrefix(m.Client, "http://127.0.0.1:") || !strings.HasPrefix(m.Peer, "http://127.0.0.1:") {
			t.Errorf("member %+v is not on loopback", m)
		}
	}
	again, existing, err := loadOrCreateLayout(dir, 3)
	if err != nil || !existing {
		t.Fatalf("second call: existing %v, %v; want the recorded layout", existing, err)
	}
	for i := range first.Members {
		if again.Members[i] != first.Members[i] || again.Token != first.Token {
			t.Fatalf("second call = %+v, want %+v", again, first)
		}
	}
}

// TestLayout_RefusesWhatItCannotRestart names the way out: another member
// count, or data without a layout.
func TestLayout_RefusesWhatItCannotRestart(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := loadOrCreateLayout(dir, 3); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadOrCreateLayout(dir, 1); err == nil || !strings.Contains(err.Error(), "--members 3") {
		t.Errorf("another member count: %v, want a refusal naming --members 3", err)
	}
	old := t.TempDir()
	if err := os.Mkdir(filepath.Join(old, "try0"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadOrCreateLayout(old, 3); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("data without a layout: %v, want a refusal saying to remove it", err)
	}
}
