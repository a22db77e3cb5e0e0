package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// gatedKV holds every read-only transaction (a batch of reads) until the
// test releases it, and can fail it instead.
type gatedKV struct {
	// KV is the shared client's, its commits decided by commit.
	clientv3.KV

	entered chan struct{} // a read batch reached Commit
	release chan error    // nil: send it to etcd; else fail it with this
	reads   atomic.Int32
}

func newGatedKV() *gatedKV {
	g := &gatedKV{entered: make(chan struct{}, 64), release: make(chan error, 64)}
	g.KV = etcdtest.Hook(shared.Client.KV, etcdtest.Hooks{Txn: g.commit})
	return g
}

func (g *gatedKV) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	if t.ReadOnly() {
		g.reads.Add(1)
		g.entered <- struct{}{}
		if err := <-g.release; err != nil {
			return nil, err
		}
	}
	return t.Send()
}

// fencedStore opens a store on kv whose scopes a and b are fenced, with
// values a/v1 = 1 and b/v2 = 2 committed, and no filters.
func fencedStore(t *testing.T, kv clientv3.KV, inflight int) *etcdstore.Store {
	t.Helper()
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true}
	w := open(t, o)
	for _, sc := range []string{"a", "b"} {
		key := o.Prefix + "own/" + sc
		w.SetFence(sc, etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	}
	if err := w.CAS("a/v1", 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := w.CAS("b/v2", 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	o.MaxInflightReads = inflight
	// Every read goes to etcd, absent keys included: these tests are
	// about the batches (exact_test.go tests the filter that answers
	// absent keys from memory).
	o.MaxFilterBytes = -1
	s := etcdstore.OpenKV(kv, o)
	t.Cleanup(func() { s.Close() })
	for _, sc := range []string{"a", "b"} {
		key := o.Prefix + "own/" + sc
		resp, err := shared.Client.Get(context.Background(), key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("Get(%q) = %v, %v", key, resp, err)
		}
		s.SetFence(sc, etcdstore.Fence{Key: key, CreateRevision: resp.Kvs[0].CreateRevision})
	}
	return s
}

// recv returns what ch delivers, failing the test after 10 s.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing arrived in 10 s")
		panic("unreachable")
	}
}

// waitQueued waits until n reads are queued behind the batch in flight.
func waitQueued(t *testing.T, s *etcdstore.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.QueuedReads() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads queued after 10 s, want %d", s.QueuedReads(), n)
		}
		time.Sleep(time.Millisecond) // polling a condition, not ordering goroutines
	}
}

// TestStore_ReadsArrivingDuringABatchShareTheNext: with one batch allowed
// in flight, the reads that arrive while it is held go together in the
// next request, and each gets its own key's value (absent = 0), across
// scopes.
func TestStore_ReadsArrivingDuringABatchShareTheNext(t *testing.T) {
	kv := newGatedKV()
	s := fencedStore(t, kv, 1)

	first := make(chan error, 1)
	go func() {
		v, err := s.ReadValue("a/v1")
		if err == nil && v != 1 {
			err = fmt.Errorf("ReadValue(a/v1) = %d, want 1", v)
		}
		first <- err
	}()
	recv(t, kv.entered)

	names := []string{"a/v1x", "b/v2", "a/absent", "b/v2x", "b/absent"}
	got := make(map[string]uint64)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	for _, name := range names {
		wg.Go(func() {
			v, err := s.ReadValue(name)
			if err != nil {
				errs <- fmt.Errorf("ReadValue(%q): %w", name, err)
				return
			}
			mu.Lock()
			got[name] = v
			mu.Unlock()
		})
	}
	waitQueued(t, s, len(names))
	kv.release <- nil // the first batch
	if err := recv(t, first); err != nil {
		t.Fatal(err)
	}
	recv(t, kv.entered)
	kv.release <- nil // the second: every queued read
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	recv(t, waited)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	want := map[string]uint64{"a/v1x": 0, "b/v2": 2, "a/absent": 0, "b/v2x": 0, "b/absent": 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("values read (-want +got):\n%s", diff)
	}
	if n := kv.reads.Load(); n != 2 {
		t.Errorf("read requests = %d, want 2 (one alone, then the %d queued together)", n, len(names))
	}
	if n := s.ReadRequests(); n != 2 {
		t.Errorf("ReadRequests = %d, want 2", n)
	}
}

// TestStore_FailedReadBatchFailsOnlyItsReads: a batch whose request fails
// fails each of its reads with that error; the reads queued behind it go
// in the next batch and succeed, and so does a later read: no turn is
// lost with the failed batch.
func TestStore_FailedReadBatchFailsOnlyItsReads(t *testing.T) {
	kv := newGatedKV()
	s := fencedStore(t, kv, 1)
	boom := errors.New("injected: connection lost")

	first := make(chan error, 1)
	go func() {
		_, err := s.ReadValue("a/v1")
		first <- err
	}()
	recv(t, kv.entered)
	second := make(chan error, 1)
	go func() {
		v, err := s.ReadValue("b/v2")
		if err == nil && v != 2 {
			err = fmt.Errorf("ReadValue(b/v2) = %d, want 2", v)
		}
		second <- err
	}()
	waitQueued(t, s, 1)
	kv.release <- boom
	if err := recv(t, first); !errors.Is(err, boom) {
		t.Fatalf("ReadValue in the failed batch = %v, want the request's error", err)
	}
	recv(t, kv.entered)
	kv.release <- nil
	if err := recv(t, second); err != nil {
		t.Fatalf("ReadValue queued behind the failed batch = %v", err)
	}
	// The failed read was not cached: it reads etcd again.
	kv.release <- nil
	if v, err := s.ReadValue("a/v1"); err != nil || v != 1 {
		t.Fatalf("ReadValue(a/v1) after the failure = %d, %v, want 1", v, err)
	}
	recv(t, kv.entered)
}

// TestStore_BatchedReadsUnderConcurrentCommits: many goroutines CAS and
// read values of several fenced scopes while commits run (go test -race):
// each sees its own writes and every read is a value that was committed
// or staged, never another key's.
func TestStore_BatchedReadsUnderConcurrentCommits(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true, MaxInflightReads: 2}
	s := open(t, o)
	const scopes, perScope, rounds = 4, 4, 20
	for i := range scopes {
		sc := fmt.Sprintf("s%d", i)
		key := o.Prefix + "own/" + sc
		s.SetFence(sc, etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	}
	var wg sync.WaitGroup
	errs := make(chan error, scopes*perScope)
	for i := range scopes {
		for j := range perScope {
			wg.Go(func() {
				sc := fmt.Sprintf("s%d", i)
				// Each goroutine owns one counter and reads a key nobody
				// writes (absent: 0) beside it, so that the batches mix
				// present and absent keys of several scopes.
				mine := fmt.Sprintf("%s/c%d", sc, j)
				for r := range uint64(rounds) {
					if v, err := s.ReadValue(mine); err != nil || v != r {
						errs <- fmt.Errorf("ReadValue(%q) = %d, %v, want %d", mine, v, err, r)
						return
					}
					if v, err := s.ReadValue(fmt.Sprintf("%s/none%d-%d", sc, j, r)); err != nil || v != 0 {
						errs <- fmt.Errorf("ReadValue of an absent key = %d, %v, want 0", v, err)
						return
					}
					if err := s.CAS(mine, r, r+1); err != nil {
						errs <- err
						return
					}
					if err := s.FlushScopes(sc); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A fresh store reads every counter back from etcd.
	fresh := open(t, etcdstore.Options{Prefix: o.Prefix, Scope: byFirstSegment})
	for i := range scopes {
		for j := range perScope {
			name := fmt.Sprintf("s%d/c%d", i, j)
			if v, err := fresh.ReadValue(name); err != nil || v != rounds {
				t.Errorf("ReadValue(%q) from a fresh store = %d, %v, want %d", name, v, err, rounds)
			}
		}
	}
}

// TestStore_RefusedCommitIsExplainedByAReadBack: a commit carries no Else
// reads; when etcd refuses it, one read of the compared keys says which
// scope's compare fails (here a's fence), that scope fails alone and the
// other commits in the retry. When that read itself fails, nobody can be
// blamed alone and every scope of the transaction fails (ErrConflict),
// with nothing written.
func TestStore_RefusedCommitIsExplainedByAReadBack(t *testing.T) {
	for _, readFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("readFails=%v", readFails), func(t *testing.T) {
			kv := newGatedKV()
			s := fencedStore(t, kv, 1)
			deleteKey(t, s.Prefix()+"own/a")
			mustAppend(t, s, "a/log", "a0", 0)
			mustAppend(t, s, "b/log", "b0", 0)
			done := make(chan error, 1)
			go func() { done <- s.Flush() }()
			recv(t, kv.entered) // the read back of the refused commit
			if readFails {
				kv.release <- errors.New("injected: read back lost")
			} else {
				kv.release <- nil
			}
			if err := recv(t, done); err == nil {
				t.Fatal("Flush with a's fence gone = nil, want a's failure")
			}
			errA, errB := s.Failed("a"), s.Failed("b")
			fresh := open(t, etcdstore.Options{Prefix: s.Prefix(), Scope: byFirstSegment})
			if readFails {
				if !errors.Is(errA, etcdstore.ErrConflict) || !errors.Is(errB, etcdstore.ErrConflict) {
					t.Fatalf("Failed(a), Failed(b) = %v, %v; want ErrConflict for both", errA, errB)
				}
				if got := readAll(t, fresh, "b/log"); len(got) != 0 {
					t.Fatalf("b/log = %v, want nothing written", got)
				}
			} else {
				if !errors.Is(errA, etcdstore.ErrFenced) || errB != nil {
					t.Fatalf("Failed(a), Failed(b) = %v, %v; want ErrFenced, nil", errA, errB)
				}
				if got := readAll(t, fresh, "b/log"); fmt.Sprint(got) != "[b0]" {
					t.Fatalf("b/log = %v, want [b0]", got)
				}
			}
			if got := readAll(t, fresh, "a/log"); len(got) != 0 {
				t.Fatalf("a/log = %v, want nothing written", got)
			}
		})
	}
}
