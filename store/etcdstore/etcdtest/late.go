package etcdtest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Late is a clientv3.KV that holds back one write transaction: the first,
// after Arm, that puts a key under the armed prefix (and has no Else), or,
// after ArmDelete, that deletes the armed key. Its
// Commit fails as a timeout does (context.DeadlineExceeded: the caller
// cannot know the outcome) without reaching etcd, and Apply sends it later,
// as a request stuck in the network or in a member's queue applies after
// its client gave up. Every other call passes through. Late is safe for
// concurrent use.
type Late struct {
	// KV is kv, its transactions' commits decided by commit.
	clientv3.KV
	kv clientv3.KV

	// mu guards the fields below.
	mu sync.Mutex
	// armed reports whether a transaction is the one to hold back, nil
	// while not armed; held is the transaction held back.
	armed func(*Txn) bool
	held  *Txn
}

// HoldLate returns kv with nothing armed.
func HoldLate(kv clientv3.KV) *Late {
	l := &Late{kv: kv}
	l.KV = Hook(kv, Hooks{Txn: l.commit})
	return l
}

// Arm holds back the next transaction that puts a key under prefix and
// has no Else.
func (l *Late) Arm(prefix string) {
	l.arm(func(t *Txn) bool {
		return len(t.Elses) == 0 && t.Has(func(op clientv3.Op) bool {
			return op.IsPut() && strings.HasPrefix(string(op.KeyBytes()), prefix)
		})
	})
}

// ArmDelete holds back the next transaction that deletes key (a release
// of a claim, say).
func (l *Late) ArmDelete(key string) {
	l.arm(func(t *Txn) bool {
		return t.Has(func(op clientv3.Op) bool { return op.IsDelete() && string(op.KeyBytes()) == key })
	})
}

func (l *Late) arm(match func(*Txn) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = match
}

// Apply sends the held transaction to etcd and reports whether it
// committed. It fails t when none is held or the call fails.
func (l *Late) Apply(t testing.TB) bool {
	t.Helper()
	l.mu.Lock()
	h := l.held
	l.mu.Unlock()
	if h == nil {
		t.Fatal("no transaction held back")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := l.kv.Txn(ctx).If(h.Cmps...).Then(h.Thens...).Commit()
	if err != nil {
		t.Fatalf("late transaction: %v", err)
	}
	return resp.Succeeded
}

func (l *Late) commit(_ context.Context, t *Txn) (*clientv3.TxnResponse, error) {
	if l.hold(t) {
		return nil, context.DeadlineExceeded
	}
	return t.Send()
}

// hold reports whether t is the transaction to hold back, and disarms.
func (l *Late) hold(t *Txn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed == nil || !l.armed(t) {
		return false
	}
	l.armed, l.held = nil, t
	return true
}

var _ clientv3.KV = (*Late)(nil)
