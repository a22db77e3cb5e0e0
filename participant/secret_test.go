package participant_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/participantd/participantd/participant"
)

// TestLoadOrCreateNodeKey_ConcurrentCreatorsAgree starts many creators at
// once on fresh directories: every one must return the key that ends up in
// node.key, or a server could serve secrets no restart can verify.
func TestLoadOrCreateNodeKey_ConcurrentCreatorsAgree(t *testing.T) {
	const rounds, creators = 50, 8
	for round := 0; round < rounds; round++ {
		dir := t.TempDir()
		start := make(chan struct{})
		keys := make([][]byte, creators)
		errs := make([]error, creators)
		var wg sync.WaitGroup
		for i := range creators {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				keys[i], errs[i] = participant.LoadOrCreateNodeKey(dir)
			}()
		}
		close(start)
		wg.Wait()
		onDisk, err := os.ReadFile(filepath.Join(dir, participant.NodeKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		for i := range creators {
			if errs[i] != nil {
				t.Fatalf("round %d: creator %d: LoadOrCreateNodeKey() error: %v", round, i, errs[i])
			}
			if !bytes.Equal(keys[i], onDisk) {
				t.Fatalf("round %d: creator %d returned key %x, node.key holds %x", round, i, keys[i], onDisk)
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Fatalf("round %d: directory holds %d entries, want node.key only", round, len(entries))
		}
	}
}

func TestLoadOrCreateNodeKey_ReloadsTheSameKey(t *testing.T) {
	dir := t.TempDir()
	k1, err := participant.LoadOrCreateNodeKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := participant.LoadOrCreateNodeKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1, k2) || len(k1) != participant.NodeKeySize {
		t.Errorf("second load = %x, want %x", k2, k1)
	}
	fi, err := os.Stat(filepath.Join(dir, participant.NodeKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node.key mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}

func TestLoadOrCreateNodeKey_BadFileRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		mode os.FileMode
		want string
	}{
		{"short", make([]byte, 16), 0o600, "16 bytes"},
		{"long", make([]byte, 64), 0o600, "64 bytes"},
		{"empty", nil, 0o600, "0 bytes"},
		{"readable by others", make([]byte, participant.NodeKeySize), 0o644, "mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, participant.NodeKeyFile)
			if err := os.WriteFile(path, tc.data, tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			if _, err := participant.LoadOrCreateNodeKey(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadOrCreateNodeKey() = %v, want an error about %s", err, tc.want)
			}
		})
	}
}
