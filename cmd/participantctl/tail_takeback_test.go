package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
)

// TestSavedAfter_WaitsForTheOtherSessionsSave: a tail that learns its
// binding was superseded before the superseding session rewrote the
// credential file keeps re-reading it, instead of attaching with the
// superseded generation (refused stale_authority: the takeover script
// met it on a loaded machine).
func TestSavedAfter_WaitsForTheOtherSessionsSave(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bob.json")
	cred := client.Credential{Conversation: 9, Participant: 1, Generation: 2}
	if err := writeCreds(path, cred); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan client.Credential, 1)
	errs := make(chan error, 1)
	go func() {
		c, err := savedAfter(ctx, path, 2, time.Millisecond)
		got <- c
		errs <- err
	}()
	newer := cred
	newer.Generation = 3
	if err := writeCreds(path, newer); err != nil {
		t.Fatal(err)
	}
	if c, err := <-got, <-errs; err != nil || c.Generation != 3 {
		t.Fatalf("savedAfter = generation %d, %v; want the saved generation 3", c.Generation, err)
	}

	short, stop := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer stop()
	if _, err := savedAfter(short, path, 3, time.Millisecond); err == nil || !strings.Contains(err.Error(), "still holds generation 3") {
		t.Fatalf("savedAfter with nothing newer saved = %v, want it to say the file still holds generation 3", err)
	}
}
