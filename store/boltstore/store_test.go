package boltstore_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/storetest"
)

func openBolt(t *testing.T, path string) *boltstore.Store {
	t.Helper()
	b, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatalf("Open(%s) error: %v", path, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestBolt_Conformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.DurableStore {
			return openBolt(t, filepath.Join(t.TempDir(), "data.db"))
		},
		Restart: func(t *testing.T, s store.DurableStore) store.DurableStore {
			b := s.(*boltstore.Store)
			if err := b.Close(); err != nil {
				t.Fatalf("Close() error: %v", err)
			}
			return openBolt(t, b.Path())
		},
	})
}

func TestBolt_Open_SecondOpenFailsFastWithErrLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.db")
	openBolt(t, path)

	start := time.Now()
	b, err := boltstore.Open(path, boltstore.Options{LockTimeout: 100 * time.Millisecond})
	if err == nil {
		b.Close()
		t.Fatalf("second Open(%s) succeeded, want ErrLocked", path)
	}
	if !errors.Is(err, store.ErrLocked) {
		t.Fatalf("second Open error = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("second Open error %q does not name %s", err, path)
	}
	// Generous bound: the point is that it does not hang.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("second Open took %v with LockTimeout 100ms", d)
	}
}

func TestBolt_Open_AfterCloseSucceeds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.db")
	b := openBolt(t, path)
	if err := b.Close(); err != nil {
		t.Fatalf("Close() error: %v", err)
	}
	openBolt(t, path)
}

// TestBolt_Flush_CoalescesConcurrentFlushes holds the first commit in
// progress, lets many goroutines append and flush meanwhile, and checks that
// all of them share one second commit.
func TestBolt_Flush_CoalescesConcurrentFlushes(t *testing.T) {
	const waiters = 32
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	var waiting sync.WaitGroup
	waiting.Add(1 + waiters)
	b, err := boltstore.OpenWithHooks(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{}, boltstore.TestHooks{
		BeforeCommit: func() {
			once.Do(func() {
				close(entered)
				<-release
			})
		},
		FlushWaiting: waiting.Done,
	})
	if err != nil {
		t.Fatalf("Open error: %v", err)
	}
	defer b.Close()

	errs := make(chan error, 1+waiters)
	flusher := func(stream string) {
		if _, err := b.Append(stream, []byte(stream), 0); err != nil {
			errs <- err
			waiting.Done()
			return
		}
		errs <- b.Flush()
	}
	go flusher("first")
	<-entered // the first commit is now in progress and held
	for i := range waiters {
		go flusher(fmt.Sprintf("s%02d", i))
	}
	waiting.Wait() // every Flush is blocked on a batch
	close(release)
	for range 1 + waiters {
		if err := <-errs; err != nil {
			t.Fatalf("Append/Flush error: %v", err)
		}
	}

	st := b.Stats()
	if st.Flushes != 1+waiters || st.Commits != 2 {
		t.Fatalf("Stats() = %+v, want Flushes %d, Commits 2", st, 1+waiters)
	}
	for i := range waiters {
		stream := fmt.Sprintf("s%02d", i)
		if n, err := b.Len(stream); err != nil || n != 1 {
			t.Fatalf("Len(%s) = %d, %v, want 1", stream, n, err)
		}
	}
	// Nothing staged now: Flush returns without a transaction.
	if err := b.Flush(); err != nil {
		t.Fatalf("Flush() of nothing = %v", err)
	}
	if got := b.Stats().Commits; got != 2 {
		t.Fatalf("Commits after an empty Flush = %d, want 2", got)
	}
}

// TestBolt_Flush_WaitsForCommitInProgress checks that a Flush with nothing
// staged still waits for a commit in progress, which may carry writes that
// returned before it.
func TestBolt_Flush_WaitsForCommitInProgress(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	var waiting sync.WaitGroup
	waiting.Add(2)
	b, err := boltstore.OpenWithHooks(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{}, boltstore.TestHooks{
		BeforeCommit: func() { once.Do(func() { close(entered); <-release }) },
		FlushWaiting: waiting.Done,
	})
	if err != nil {
		t.Fatalf("Open error: %v", err)
	}
	defer b.Close()
	if _, err := b.Append("s", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- b.Flush() }()
	<-entered
	second := make(chan error, 1)
	go func() { second <- b.Flush() }()
	waiting.Wait()
	select {
	case err := <-second:
		t.Fatalf("Flush() returned %v while the commit it depends on was held", err)
	default:
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first Flush() = %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second Flush() = %v", err)
	}
	if got := b.Stats().Commits; got != 1 {
		t.Fatalf("Commits = %d, want 1", got)
	}
}

func TestBolt_Commit_FailureIsSticky(t *testing.T) {
	errInjected := errors.New("injected fsync failure")
	var fail sync.Mutex // guards failing
	failing := false
	path := filepath.Join(t.TempDir(), "data.db")
	b, err := boltstore.OpenWithHooks(path, boltstore.Options{}, boltstore.TestHooks{
		CommitErr: func() error {
			fail.Lock()
			defer fail.Unlock()
			if failing {
				return errInjected
			}
			return nil
		},
	})
	if err != nil {
		t.Fatalf("Open error: %v", err)
	}
	if _, err := b.Append("s", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatalf("Flush() = %v", err)
	}
	fail.Lock()
	failing = true
	fail.Unlock()
	if _, err := b.Append("s", []byte("lost"), 1); err != nil {
		t.Fatal(err)
	}
	if err := b.CAS("k", 0, 1); err != nil {
		t.Fatal(err)
	}
	err = b.Flush()
	if !errors.Is(err, store.ErrFailed) || !errors.Is(err, errInjected) {
		t.Fatalf("Flush() with a failing commit = %v, want ErrFailed wrapping the cause", err)
	}

	calls := []struct {
		name string
		call func() error
	}{
		{"Append", func() error { _, err := b.Append("s", []byte("y"), 2); return err }},
		{"ReadFrom", func() error { _, err := b.ReadFrom("s", 0, 0); return err }},
		{"Len", func() error { _, err := b.Len("s"); return err }},
		{"CAS", func() error { return b.CAS("k", 1, 2) }},
		{"ReadValue", func() error { _, err := b.ReadValue("k"); return err }},
		{"Scan", func() error { _, err := b.Scan(""); return err }},
		{"Flush", b.Flush},
		{"Close", b.Close},
		{"Append after Close", func() error { _, err := b.Append("s", []byte("y"), 2); return err }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, store.ErrFailed) || !errors.Is(err, errInjected) {
			t.Errorf("%s after a failed commit = %v, want ErrFailed wrapping the cause", c.name, err)
		}
	}

	// Close released the file; the failed commit left nothing behind.
	r := openBolt(t, path)
	got, err := r.ReadFrom("s", 0, 0)
	if err != nil || len(got) != 1 || string(got[0].Payload) != "kept" {
		t.Fatalf("after reopen ReadFrom(s) = %v, %v, want only \"kept\"", got, err)
	}
	if v, err := r.ReadValue("k"); err != nil || v != 0 {
		t.Fatalf("after reopen ReadValue(k) = %d, %v, want 0", v, err)
	}
}

// TestBolt_Close_FailsWaitingFlush checks that Close waits for a commit in
// progress and fails a Flush waiting for a later one with ErrClosed.
func TestBolt_Close_FailsWaitingFlush(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	var waiting sync.WaitGroup
	waiting.Add(2)
	path := filepath.Join(t.TempDir(), "data.db")
	b, err := boltstore.OpenWithHooks(path, boltstore.Options{}, boltstore.TestHooks{
		BeforeCommit: func() { once.Do(func() { close(entered); <-release }) },
		FlushWaiting: waiting.Done,
	})
	if err != nil {
		t.Fatalf("Open error: %v", err)
	}
	if _, err := b.Append("s", []byte("committed"), 0); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- b.Flush() }()
	<-entered
	if _, err := b.Append("s", []byte("discarded"), 1); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() { second <- b.Flush() }()
	waiting.Wait()
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	// Release the held commit only once Close has marked the store closed,
	// so the committer cannot start the later commit.
	for {
		if _, err := b.Len("s"); errors.Is(err, store.ErrClosed) {
			break
		}
		runtime.Gosched()
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("Flush() of the commit in progress = %v, want nil", err)
	}
	if err := <-second; !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Flush() waiting for a later commit = %v, want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close() = %v", err)
	}
	r := openBolt(t, path)
	if n, err := r.Len("s"); err != nil || n != 1 {
		t.Fatalf("after reopen Len(s) = %d, %v, want 1", n, err)
	}
}

// TestBolt_ValueCache_ForgetsDurableKeys: a token index writes one key per
// operation, so the cache must not keep keys once they are durable.
func TestBolt_ValueCache_ForgetsDurableKeys(t *testing.T) {
	b, err := boltstore.Open(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := range 1000 {
		key := fmt.Sprintf("token/%d", i)
		if err := b.CAS(key, 0, uint64(i)+1); err != nil {
			t.Fatal(err)
		}
		if err := b.CAS(key, 5000, 1); !errors.Is(err, store.ErrCASConflict) {
			t.Fatalf("CAS(%s, 5000) = %v, want a conflict", key, err)
		}
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := b.CachedValues(); n != 0 {
		t.Fatalf("value cache holds %d keys after they all became durable, want 0", n)
	}
	for i := range 1000 {
		if v, err := b.ReadValue(fmt.Sprintf("token/%d", i)); err != nil || v != uint64(i)+1 {
			t.Fatalf("ReadValue(token/%d) = %d, %v; want %d from the file", i, v, err, i+1)
		}
	}
	if err := b.CAS("token/7", 99, 1); !errors.Is(err, store.ErrCASConflict) {
		t.Fatalf("CAS on a key read from the file with a wrong old value = %v, want a conflict", err)
	}
	// Reads are cached until the next commit, which forgets them all.
	if err := b.CAS("other", 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := b.CachedValues(); n != 0 {
		t.Fatalf("value cache holds %d keys after a commit, want 0", n)
	}
}

// TestBolt_CAS_ConcurrentIncrementsAcrossCommits: goroutines increment one
// key by CAS while others flush, so the key keeps leaving the value cache
// as commits make it durable. No increment may be lost: a CAS must never
// compare against a value a commit has since replaced.
func TestBolt_CAS_ConcurrentIncrementsAcrossCommits(t *testing.T) {
	b := openBolt(t, filepath.Join(t.TempDir(), "data.db"))
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for done := 0; done < each; {
				v, err := b.ReadValue("counter")
				if err != nil {
					t.Error(err)
					return
				}
				err = b.CAS("counter", v, v+1)
				switch {
				case err == nil:
					done++
					if done%3 == 0 {
						if err := b.Flush(); err != nil {
							t.Error(err)
							return
						}
					}
				case !errors.Is(err, store.ErrCASConflict):
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if v, err := b.ReadValue("counter"); err != nil || v != workers*each {
		t.Fatalf("counter = %d, %v after %d successful increments: an increment was lost", v, err, workers*each)
	}
}

// TestBolt_CAS_AfterACommitReplacedTheValueItRead: a CAS reads a key's
// value from the file; before it compares, another CAS of the key commits
// and the cache forgets the key. The first CAS must compare against the
// committed value, not the one it read.
func TestBolt_CAS_AfterACommitReplacedTheValueItRead(t *testing.T) {
	var b *boltstore.Store
	var interleaved atomic.Bool
	b, err := boltstore.OpenWithHooks(filepath.Join(t.TempDir(), "data.db"), boltstore.Options{}, boltstore.TestHooks{
		CASLoaded: func(key string) {
			if interleaved.Swap(true) {
				return // the interleaved CAS's own load
			}
			if err := b.CAS(key, 0, 7); err != nil {
				t.Errorf("interleaved CAS: %v", err)
			}
			if err := b.Flush(); err != nil {
				t.Errorf("interleaved Flush: %v", err)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.CAS("k", 0, 1); !errors.Is(err, store.ErrCASConflict) {
		t.Fatalf("CAS(k, 0, 1) after another CAS committed 7 = %v, want a conflict", err)
	}
	if v, _ := b.ReadValue("k"); v != 7 {
		t.Fatalf("k = %d, want 7: the stale CAS overwrote a committed value", v)
	}
}

// TestBolt_ReadValueThenCAS_ReadsTheFileOnce: a token lookup reads the
// key, then writes it by CAS; the CAS must not read the file again.
func TestBolt_ReadValueThenCAS_ReadsTheFileOnce(t *testing.T) {
	b := openBolt(t, filepath.Join(t.TempDir(), "data.db"))
	before := b.Stats().ValueLoads
	if v, err := b.ReadValue("token/1"); err != nil || v != 0 {
		t.Fatalf("ReadValue = %d, %v", v, err)
	}
	if err := b.CAS("token/1", 0, 9); err != nil {
		t.Fatal(err)
	}
	if n := b.Stats().ValueLoads - before; n != 1 {
		t.Fatalf("ReadValue then CAS read the file %d times, want 1", n)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := b.CachedValues(); n != 0 {
		t.Fatalf("value cache holds %d keys after a commit, want 0", n)
	}
}
