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
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// cmpKV records the compares of every transaction that writes, and holds
// the next one that writes while hold is armed, until the test releases
// it.
type cmpKV struct {
	// KV is the shared client's, its commits decided by commit.
	clientv3.KV

	mu      sync.Mutex
	cmps    [][]clientv3.Cmp // compares of each writing transaction
	hold    bool
	entered chan struct{}
	release chan struct{}
}

func newCmpKV() *cmpKV {
	k := &cmpKV{entered: make(chan struct{}, 1), release: make(chan struct{}, 1)}
	k.KV = etcdtest.Hook(shared.Client.KV, etcdtest.Hooks{Txn: k.commit})
	return k
}

// compares returns the compares of the writing transactions sent so far.
func (k *cmpKV) compares() [][]clientv3.Cmp {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([][]clientv3.Cmp(nil), k.cmps...)
}

func (k *cmpKV) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	if t.Writes() {
		k.mu.Lock()
		k.cmps = append(k.cmps, t.Cmps)
		hold := k.hold
		k.hold = false
		k.mu.Unlock()
		if hold {
			k.entered <- struct{}{}
			<-k.release
		}
	}
	return t.Send()
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

// TestStore_AbsentValuesOfAScopeLoadedUnderItsClaimAreReadFromMemory: a
// scope loaded under its claim answers reads (and CASes) of values it
// never saw without asking etcd; values etcd held at the load, and those
// the store committed since, are read as they are.
func TestStore_AbsentValuesOfAScopeLoadedUnderItsClaimAreReadFromMemory(t *testing.T) {
	first := exactStore(t, shared.Client.KV)
	if err := first.CAS("a/pre", 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := first.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	first.Close()

	// A new owner: the claim deleted and made anew.
	o := etcdstore.Options{Prefix: first.Prefix(), Scope: byFirstSegment, RequireFence: true}
	s := etcdstore.OpenKV(shared.Client.KV, o)
	defer s.Close()
	key := o.Prefix + "own/a"
	deleteKey(t, key)
	s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	s.Reset("a")
	if v, err := s.ReadValue("a/pre"); err != nil || v != 5 {
		t.Fatalf("ReadValue(a/pre) = %d, %v, want 5 (in etcd before the load)", v, err)
	}
	mem, reads := s.MemoryReads(), s.ReadRequests()
	for i := range 10 {
		if v, err := s.ReadValue(fmt.Sprintf("a/new%d", i)); err != nil || v != 0 {
			t.Fatalf("ReadValue(a/new%d) = %d, %v, want 0", i, v, err)
		}
	}
	if err := s.CAS("a/new0", 0, 7); err != nil {
		t.Fatal(err)
	}
	// A false "maybe" costs a read: about 1 in 100.
	if got := s.MemoryReads() - mem; got < 9 {
		t.Fatalf("%d of 11 reads of absent values answered from memory (%d requests), want at least 9", got, s.ReadRequests()-reads)
	}
	if err := s.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.ReadValue("a/new0"); err != nil || v != 7 {
		t.Fatalf("ReadValue(a/new0) after its commit = %d, %v, want 7", v, err)
	}
	if err := s.CAS("a/new0", 7, 8); err != nil {
		t.Fatalf("CAS(a/new0, 7, 8) after its commit = %v", err)
	}
	if err := s.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
}

// TestStore_ValueOfACommitWhoseAnswerWasLostIsReadAfterReset: a commit
// that applied but whose answer was lost fails the scope; after Reset the
// scope is settled and loaded again, listing the values etcd holds, so the
// value that commit wrote (a token's index entry) is read as written, not
// answered absent from memory (which would commit the token a second
// time).
func TestStore_ValueOfACommitWhoseAnswerWasLostIsReadAfterReset(t *testing.T) {
	fault := &writeFault{mode: unknownApplied}
	s := exactStore(t, fault.kv())
	if v, err := s.ReadValue("a/token"); err != nil || v != 0 {
		t.Fatalf("ReadValue(a/token) = %d, %v, want 0", v, err)
	}
	if err := s.CAS("a/token", 0, 3); err != nil {
		t.Fatal(err)
	}
	fault.Arm(1) // the next commit applies, its answer lost
	if err := s.FlushScopes("a"); !errors.Is(err, etcdstore.ErrUnknownOutcome) {
		t.Fatalf("FlushScopes(a) with its answer lost = %v, want ErrUnknownOutcome", err)
	}
	s.Reset("a")
	if v, err := s.ReadValue("a/token"); err != nil || v != 3 {
		t.Fatalf("ReadValue(a/token) after Reset = %d, %v, want 3 (the lost answer's commit applied)", v, err)
	}
	if s.Settles() != 1 {
		t.Fatalf("%d settles, want 1", s.Settles())
	}
}

// TestStore_AFilterPastItsByteBoundIsDropped: a store whose filters may
// take 1,280 bytes (one first segment) keeps a scope's filter until its
// commits would grow it past that; then the scope reads absent values
// from etcd again, and reads stay right throughout.
func TestStore_AFilterPastItsByteBoundIsDropped(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true, MaxFilterBytes: 1280}
	s := open(t, o)
	key := o.Prefix + "own/a"
	s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	s.Reset("a")
	readAbsent := func() {
		t.Helper()
		if v, err := s.ReadValue("a/absent"); err != nil || v != 0 {
			t.Fatalf("ReadValue(a/absent) = %d, %v, want 0", v, err)
		}
	}
	readAbsent()
	if s.MemoryReads() != 1 {
		t.Fatalf("MemoryReads = %d, want 1 (the filter fits its bound)", s.MemoryReads())
	}
	for i := range 1100 {
		if err := s.CAS(fmt.Sprintf("a/t%d", i), 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	mem, reads := s.MemoryReads(), s.ReadRequests()
	readAbsent()
	if s.MemoryReads() != mem || s.ReadRequests() != reads+1 {
		t.Fatalf("memory reads +%d, read requests +%d; want +0 and +1 (the filter dropped past its bound)", s.MemoryReads()-mem, s.ReadRequests()-reads)
	}
	if v, err := s.ReadValue("a/t1099"); err != nil || v != 1 {
		t.Fatalf("ReadValue(a/t1099) = %d, %v, want 1", v, err)
	}
}

// TestStore_AnExactScopeKeepsItsReadsAcrossItsCommits: a value of a scope
// loaded under its claim, once read, is not read from etcd again after
// the scope's next commits (only the store's own CAS changes it), and a
// CAS of it is read as written.
func TestStore_AnExactScopeKeepsItsReadsAcrossItsCommits(t *testing.T) {
	first := exactStore(t, shared.Client.KV)
	if err := first.CAS("a/floor", 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := first.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	first.Close()
	o := etcdstore.Options{Prefix: first.Prefix(), Scope: byFirstSegment, RequireFence: true}
	s := etcdstore.OpenKV(shared.Client.KV, o)
	defer s.Close()
	key := o.Prefix + "own/a"
	deleteKey(t, key)
	s.SetFence("a", etcdstore.Fence{Key: key, CreateRevision: claim(t, key)})
	s.Reset("a")
	if v, err := s.ReadValue("a/floor"); err != nil || v != 5 {
		t.Fatalf("ReadValue(a/floor) = %d, %v, want 5", v, err)
	}
	reads := s.ReadRequests()
	for i := range uint64(3) {
		mustAppend(t, s, "a/log", "x", i)
		if err := s.FlushScopes("a"); err != nil {
			t.Fatal(err)
		}
		if v, err := s.ReadValue("a/floor"); err != nil || v != 5 {
			t.Fatalf("ReadValue(a/floor) after commit %d = %d, %v, want 5", i, v, err)
		}
	}
	if n := s.ReadRequests() - reads; n != 0 {
		t.Fatalf("%d read requests after the first read, want 0", n)
	}
	if err := s.CAS("a/floor", 5, 6); err != nil {
		t.Fatal(err)
	}
	if err := s.FlushScopes("a"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.ReadValue("a/floor"); err != nil || v != 6 {
		t.Fatalf("ReadValue(a/floor) after its CAS committed = %d, %v, want 6", v, err)
	}
	if err := s.CAS("a/floor", 6, 7); err != nil {
		t.Fatalf("CAS(a/floor, 6, 7) = %v", err)
	}
}
