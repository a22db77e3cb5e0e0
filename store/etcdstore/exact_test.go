package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// cmpKV records the compares of every transaction that writes, and holds
// the next one that writes while hold is armed, until the test releases
// it.
type cmpKV struct {
	clientv3.KV
	mu      sync.Mutex
	cmps    [][]clientv3.Cmp // compares of each writing transaction
	hold    bool
	entered chan struct{}
	release chan struct{}
}

func newCmpKV() *cmpKV {
	return &cmpKV{KV: shared.Client.KV, entered: make(chan struct{}, 1), release: make(chan struct{}, 1)}
}

func (k *cmpKV) Txn(ctx context.Context) clientv3.Txn { return &cmpTxn{Txn: k.KV.Txn(ctx), k: k} }

// compares returns the compares of the writing transactions sent so far.
func (k *cmpKV) compares() [][]clientv3.Cmp {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([][]clientv3.Cmp(nil), k.cmps...)
}

type cmpTxn struct {
	clientv3.Txn
	k       *cmpKV
	cmps    []clientv3.Cmp
	written bool
}

func (t *cmpTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *cmpTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if !op.IsGet() {
			t.written = true
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *cmpTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.written {
		t.k.mu.Lock()
		t.k.cmps = append(t.k.cmps, t.cmps)
		hold := t.k.hold
		t.k.hold = false
		t.k.mu.Unlock()
		if hold {
			t.k.entered <- struct{}{}
			<-t.k.release
		}
	}
	return t.Txn.Commit()
}

// exactStore opens a store on kv whose scope a is fenced by a fresh claim.
func exactStore(t *testing.T, kv clientv3.KV) *etcdstore.Store {
	t.Helper()
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true}
	s := etcdstore.OpenKV(kv, o)
	t.Cleanup(func() { s.Close() })
	key := o.Prefix + "own/a"
	s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	s.Reset("a")
	return s
}

// TestStore_FencedScopeLoadedUnderItsClaimComparesTheFenceAlone: a scope
// loaded under its claim commits appends to two streams and a CAS with
// one compare, the fence's: nobody else commits under the claim, so the
// store's lengths and values are etcd's. A scope whose lengths were read
// before its fence was set still compares them.
func TestStore_FencedScopeLoadedUnderItsClaimComparesTheFenceAlone(t *testing.T) {
	kv := newCmpKV()
	s := exactStore(t, kv)
	for round := range uint64(2) {
		mustAppend(t, s, "a/oplog", fmt.Sprintf("o%d", round), round)
		mustAppend(t, s, "a/outbox", fmt.Sprintf("x%d", round), round)
		if err := s.CAS(fmt.Sprintf("a/token%d", round), 0, round+1); err != nil {
			t.Fatal(err)
		}
		if err := s.FlushScopes("a"); err != nil {
			t.Fatalf("FlushScopes(a) round %d = %v", round, err)
		}
	}
	for i, cs := range kv.compares() {
		if len(cs) != 1 || string(cs[0].KeyBytes()) != s.Prefix()+"own/a" {
			t.Fatalf("transaction %d compares %d keys (%v), want the fence's alone", i, len(cs), cs)
		}
	}

	// Lengths read before the fence: the next commit compares them.
	o := etcdstore.Options{Prefix: s.Prefix(), Scope: byFirstSegment}
	kv2 := newCmpKV()
	late := etcdstore.OpenKV(kv2, o)
	defer late.Close()
	if n, err := late.Len("a/oplog"); err != nil || n != 2 {
		t.Fatalf("Len(a/oplog) = %d, %v, want 2", n, err)
	}
	key := s.Prefix() + "own/b"
	late.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	mustAppend(t, late, "a/oplog", "late", 2)
	if err := late.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	if cs := kv2.compares(); len(cs) != 1 || len(cs[0]) != 2 {
		t.Fatalf("commit of a scope loaded before its fence compares %v, want the fence and the length", cs)
	}
}

// TestStore_ResetDuringACommitReloadsAfterIt: a fenced scope reset while
// its commit is in flight (the participant reconciling a conversation
// whose flush failed) loads its lengths only once that commit has an
// outcome. Loaded before, it would miss the commit's entries, and the next
// commit, which compares only the fence, would overwrite them: a fork.
func TestStore_ResetDuringACommitReloadsAfterIt(t *testing.T) {
	kv := newCmpKV()
	s := exactStore(t, kv)
	mustAppend(t, s, "a/log", "a0", 0)
	if err := s.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	kv.mu.Lock()
	kv.hold = true
	kv.mu.Unlock()
	// A failing test still lets the held commit go, so that Close returns.
	t.Cleanup(func() {
		select {
		case kv.release <- struct{}{}:
		default:
		}
	})
	mustAppend(t, s, "a/log", "a1", 1)
	flushed := make(chan error, 1)
	go func() { flushed <- s.FlushScopes("a") }()
	recv(t, kv.entered)
	s.Reset("a")
	type lenResult struct {
		n   uint64
		err error
	}
	loaded := make(chan lenResult, 1)
	go func() {
		n, err := s.Len("a/log")
		loaded <- lenResult{n, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s.LoadWaits() == 0 {
		select {
		case r := <-loaded:
			t.Fatalf("Len(a/log) = %d, %v while the commit was in flight, want it to wait for the commit", r.n, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the load did not wait for the commit in 10 s")
		}
		time.Sleep(time.Millisecond) // polling a condition, not ordering goroutines
	}
	kv.release <- struct{}{}
	if err := recv(t, flushed); !errors.Is(err, store.ErrFailed) {
		t.Fatalf("FlushScopes(a) reset mid-commit = %v, want a failure", err)
	}
	if r := recv(t, loaded); r.err != nil || r.n != 2 {
		t.Fatalf("Len(a/log) after the commit = %d, %v, want 2", r.n, r.err)
	}
	mustAppend(t, s, "a/log", "a2", 2)
	if err := s.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	fresh := open(t, etcdstore.Options{Prefix: s.Prefix(), Scope: byFirstSegment})
	if got := readAll(t, fresh, "a/log"); fmt.Sprint(got) != "[a0 a1 a2]" {
		t.Fatalf("a/log = %v, want [a0 a1 a2]", got)
	}
}
