package etcdstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
	"github.com/participantd/participantd/store/storetest"
)

func open(t *testing.T, o etcdstore.Options) *etcdstore.Store {
	t.Helper()
	st := etcdstore.Open(shared.Client, o)
	t.Cleanup(func() { st.Close() })
	return st
}

// claim creates key (create-if-absent) and returns its create revision.
func claim(t *testing.T, key string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := shared.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "owner")).Else(clientv3.OpGet(key)).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("claim %q = %v, %v", key, resp, err)
	}
	return resp.Header.Revision
}

func deleteKey(t *testing.T, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := shared.Client.Delete(ctx, key); err != nil {
		t.Fatalf("Delete(%q) error: %v", key, err)
	}
}

func mustAppend(t *testing.T, s store.DurableStore, name, payload string, seq uint64) {
	t.Helper()
	if got, err := s.Append(name, []byte(payload), seq); err != nil || got != seq {
		t.Fatalf("Append(%q, seq=%d) = %d, %v, want %d, nil", name, seq, got, err, seq)
	}
}

func readAll(t *testing.T, s store.DurableStore, name string) []string {
	t.Helper()
	es, err := s.ReadFrom(name, 0, 0)
	if err != nil {
		t.Fatalf("ReadFrom(%q) error: %v", name, err)
	}
	var out []string
	for _, e := range es {
		out = append(out, string(e.Payload))
	}
	return out
}

// TestStore_FencedScopeFailsAloneAndDoesNotFork: once the fence key of
// scope "a" is gone (the lease expired), etcd refuses a's commit; scope
// "b", committed in the same group commit, is durable; a's calls fail
// with ErrFenced until Reset; the stream holds exactly what committed.
func TestStore_FencedScopeFailsAloneAndDoesNotFork(t *testing.T) {
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true}
	s := open(t, o)
	fenceA, fenceB := o.Prefix+"own/a", o.Prefix+"own/b"
	s.SetFence("a", etcdstore.Fence{Key: fenceA, CreateRevision: claim(t, fenceA)})
	s.SetFence("b", etcdstore.Fence{Key: fenceB, CreateRevision: claim(t, fenceB)})

	mustAppend(t, s, "a/log", "a0", 0)
	mustAppend(t, s, "b/log", "b0", 0)
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() error: %v", err)
	}

	// Another owner takes "a": the key is deleted and created anew.
	deleteKey(t, fenceA)
	newRev := claim(t, fenceA)
	mustAppend(t, s, "a/log", "a1-old-owner", 1)
	if err := s.CAS("a/v", 0, 7); err != nil {
		t.Fatalf("CAS(a/v) error: %v", err)
	}
	mustAppend(t, s, "b/log", "b1", 1)
	if err := s.FlushScopes("a"); !errors.Is(err, etcdstore.ErrFenced) || !errors.Is(err, store.ErrFailed) {
		t.Fatalf("FlushScopes(a) = %v, want ErrFenced wrapping store.ErrFailed", err)
	}
	if err := s.FlushScopes("b"); err != nil {
		t.Fatalf("FlushScopes(b) = %v, want nil: b shared the refused transaction", err)
	}
	if err := s.Flush(); !errors.Is(err, etcdstore.ErrFenced) {
		t.Fatalf("Flush() = %v, want ErrFenced (it covers every scope)", err)
	}
	if _, err := s.Append("a/log", []byte("x"), 1); !errors.Is(err, etcdstore.ErrFenced) {
		t.Fatalf("Append on fenced scope = %v, want ErrFenced", err)
	}
	if _, err := s.Len("b/log"); err != nil {
		t.Fatalf("Len(b/log) = %v; a fenced scope must not fail others", err)
	}

	// The new owner sees exactly what committed: no fork.
	fresh := open(t, etcdstore.Options{Prefix: o.Prefix, Scope: byFirstSegment})
	if got := readAll(t, fresh, "a/log"); fmt.Sprint(got) != "[a0]" {
		t.Fatalf("a/log read back = %v, want [a0]", got)
	}
	if v, err := fresh.ReadValue("a/v"); err != nil || v != 0 {
		t.Fatalf("ReadValue(a/v) = %d, %v, want 0 (refused)", v, err)
	}
	if got := readAll(t, fresh, "b/log"); fmt.Sprint(got) != "[b0 b1]" {
		t.Fatalf("b/log read back = %v, want [b0 b1]", got)
	}
	mustAppend(t, fresh, "a/log", "a1-new-owner", 1)
	if err := fresh.Flush(); err != nil {
		t.Fatal(err)
	}

	// The old owner claims again: Reset makes it read etcd afresh.
	s.SetFence("a", etcdstore.Fence{Key: fenceA, CreateRevision: newRev})
	s.Reset("a")
	if got := readAll(t, s, "a/log"); fmt.Sprint(got) != "[a0 a1-new-owner]" {
		t.Fatalf("a/log after Reset = %v, want [a0 a1-new-owner]", got)
	}
	mustAppend(t, s, "a/log", "a2", 2)
	if err := s.FlushScopes("a"); err != nil {
		t.Fatalf("FlushScopes(a) after Reset = %v", err)
	}
}

// TestStore_TwoWritersCannotFork: two stores on one prefix (no fences)
// both append seq 0 of one stream; exactly one commits, the other fails
// with ErrConflict, and the stream holds the winner's entry only.
func TestStore_TwoWritersCannotFork(t *testing.T) {
	p := prefix()
	s1 := open(t, etcdstore.Options{Prefix: p})
	s2 := open(t, etcdstore.Options{Prefix: p})
	mustAppend(t, s1, "log", "one", 0)
	mustAppend(t, s2, "log", "two", 0)
	if err := s1.Flush(); err != nil {
		t.Fatalf("s1.Flush() = %v", err)
	}
	if err := s2.Flush(); !errors.Is(err, etcdstore.ErrConflict) {
		t.Fatalf("s2.Flush() = %v, want ErrConflict", err)
	}
	fresh := open(t, etcdstore.Options{Prefix: p})
	if got := readAll(t, fresh, "log"); fmt.Sprint(got) != "[one]" {
		t.Fatalf("log = %v, want [one]", got)
	}
}

// TestStore_RequireFenceRefusesUnfencedWrites: with RequireFence, a scope
// without a fence is refused before anything is staged.
func TestStore_RequireFenceRefusesUnfencedWrites(t *testing.T) {
	s := open(t, etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, RequireFence: true})
	if _, err := s.Append("a/log", []byte("x"), 0); !errors.Is(err, etcdstore.ErrNotFenced) {
		t.Fatalf("Append = %v, want ErrNotFenced", err)
	}
	if err := s.CAS("a/v", 0, 1); !errors.Is(err, etcdstore.ErrNotFenced) {
		t.Fatalf("CAS = %v, want ErrNotFenced", err)
	}
	mustAppend(t, s, "global", "g", 0) // the global scope needs no fence
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestStore_BigScopeSplitsAcrossTransactions: 300 appends and 200 CASes of
// one scope pass etcd's 128 operations per transaction (runs of one entry
// each, so that the appends are 300 puts); they commit in several
// transactions, all of them, in order.
func TestStore_BigScopeSplitsAcrossTransactions(t *testing.T) {
	var txns atomic.Int64
	o := etcdstore.Options{Prefix: prefix(), Scope: byFirstSegment, MaxRunBytes: 1, OnTxn: func(_ time.Duration, ops int, err error) {
		if ops > 2*etcdstore.DefaultMaxTxnOps || err != nil {
			panic(fmt.Sprintf("transaction of %d ops: %v", ops, err))
		}
		txns.Add(1)
	}}
	s := open(t, o)
	var want []string
	for i := range 300 {
		want = append(want, fmt.Sprintf("e%d", i))
		mustAppend(t, s, "a/log", want[i], uint64(i))
	}
	for i := range 200 {
		if err := s.CAS(fmt.Sprintf("a/v%03d", i), 0, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() = %v", err)
	}
	if n := txns.Load(); n < 4 {
		t.Fatalf("%d transactions, want at least 4 for 500 writes", n)
	}
	fresh := open(t, etcdstore.Options{Prefix: o.Prefix, Scope: byFirstSegment})
	if got := readAll(t, fresh, "a/log"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a/log has %d entries, want %d in order", len(got), len(want))
	}
	vals, err := fresh.Scan("a/v")
	if err != nil || len(vals) != 200 || vals[199].Value != 200 {
		t.Fatalf("Scan(a/v) = %d values, %v, want 200", len(vals), err)
	}
}

// TestStore_PayloadBeyondARequestIsRefused: a payload that cannot fit one
// etcd request is refused at Append, so it can never fail a commit.
func TestStore_PayloadBeyondARequestIsRefused(t *testing.T) {
	s := open(t, etcdstore.Options{Prefix: prefix()})
	big := bytes.Repeat([]byte("x"), s.MaxPayloadLen()+1)
	if _, err := s.Append("log", big, 0); !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Append(%d bytes) = %v, want ErrTooLarge", len(big), err)
	}
	mustAppend(t, s, "log", string(big[:s.MaxPayloadLen()]), 0)
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() of a maximal payload = %v", err)
	}
}

// TestStore_ConformanceThreeMembers runs the suite against a 3-member
// cluster, the replicated setup cluster mode runs on.
func TestStore_ConformanceThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd")
	}
	t.Parallel() // a cluster of its own
	c, err := etcdtest.Start(t.TempDir(), etcdtest.Options{Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	storetest.Run(t, harness(cli, etcdstore.Options{Scope: byFirstSegment}, bare))
}
