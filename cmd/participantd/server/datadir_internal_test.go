package server

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
)

// TestOpenDataDir_RacingStartsServeTheKeyOnDisk starts many openDataDir at
// once on fresh directories, as racing processes would: each that gets the
// directory must hold the key that is in node.key, and they all agree.
func TestOpenDataDir_RacingStartsServeTheKeyOnDisk(t *testing.T) {
	const rounds, racers = 20, 6
	for round := 0; round < rounds; round++ {
		dir := filepath.Join(t.TempDir(), "data")
		start := make(chan struct{})
		keys := make([][]byte, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, err := openDataDir(dir, EngineBolt, zerolog.Nop())
				if err != nil {
					errs[i] = err
					return
				}
				defer d.Close()
				onDisk, err := os.ReadFile(filepath.Join(dir, participant.NodeKeyFile))
				if err != nil {
					errs[i] = err
					return
				}
				if !bytes.Equal(d.key, onDisk) {
					errs[i] = errors.New("serving a key that is not node.key's")
				}
				keys[i] = d.key
			}()
		}
		close(start)
		wg.Wait()
		for i := range racers {
			if errs[i] != nil {
				t.Fatalf("round %d racer %d: %v", round, i, errs[i])
			}
			if !bytes.Equal(keys[i], keys[0]) {
				t.Fatalf("round %d: racer %d key %x, racer 0 key %x", round, i, keys[i], keys[0])
			}
		}
	}
}

func TestOpenDataDir_SecondHolderIsRefused(t *testing.T) {
	dir := t.TempDir()
	d, err := openDataDir(dir, EngineBolt, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lock, err := lockDataDir(dir, 50*time.Millisecond)
	if err == nil {
		lock.Close()
	}
	if !errors.Is(err, ErrDataDirLocked) {
		t.Errorf("lockDataDir while held = %v, want ErrDataDirLocked", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	lock, err = lockDataDir(dir, 50*time.Millisecond)
	if err != nil {
		t.Fatalf("lockDataDir after close = %v", err)
	}
	lock.Close()
}
