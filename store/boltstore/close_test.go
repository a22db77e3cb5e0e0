package boltstore_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
)

// TestBolt_Close_DuringCASLoadIsErrClosed closes the store while a CAS is
// between reading its key from the file and taking the lock again: the CAS
// must see the store closed, not write into the released cache.
func TestBolt_Close_DuringCASLoadIsErrClosed(t *testing.T) {
	loaded := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	b, err := boltstore.OpenWithHooks(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{}, boltstore.TestHooks{
		CASLoaded: func(string) {
			once.Do(func() {
				close(loaded)
				<-release
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.CAS("k", 0, 1) }()
	<-loaded
	if err := b.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	close(release)
	if err := <-done; !errors.Is(err, store.ErrClosed) {
		t.Errorf("CAS across Close = %v, want ErrClosed", err)
	}
}

// TestBolt_Close_ConcurrentWithReads runs reads that load from the file
// (new streams and keys) while the store closes: each either succeeds or
// returns ErrClosed, and nothing panics. Run it with -race.
func TestBolt_Close_ConcurrentWithReads(t *testing.T) {
	for round := 0; round < 20; round++ {
		b, err := boltstore.Open(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; ; i++ {
					name := fmt.Sprintf("g%d-%d", g, i)
					var err error
					switch i % 4 {
					case 0:
						_, err = b.Len(name)
					case 1:
						_, err = b.ReadValue(name)
					case 2:
						err = b.CAS(name, 0, 1)
					case 3:
						_, err = b.ReadFrom(name, 0, 0)
					}
					if err != nil {
						if !errors.Is(err, store.ErrClosed) {
							errs <- err
						}
						return
					}
				}
			}()
		}
		close(start)
		if err := b.Close(); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("a read across Close = %v, want ErrClosed", err)
		}
	}
}
