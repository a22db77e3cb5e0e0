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
	clientv3.KV

	// mu guards the fields below.
	mu sync.Mutex
	// armed reports whether a transaction is the one to hold back, nil
	// while not armed; held is the transaction held back.
	armed func(*lateTxn) bool
	held  *lateTxn
}

// HoldLate returns kv with nothing armed.
func HoldLate(kv clientv3.KV) *Late { return &Late{KV: kv} }

// Arm holds back the next transaction that puts a key under prefix and
// has no Else.
func (l *Late) Arm(prefix string) {
	l.arm(func(t *lateTxn) bool {
		return len(t.elss) == 0 && t.has(func(op clientv3.Op) bool {
			return op.IsPut() && strings.HasPrefix(string(op.KeyBytes()), prefix)
		})
	})
}

// ArmDelete holds back the next transaction that deletes key (a release
// of a claim, say).
func (l *Late) ArmDelete(key string) {
	l.arm(func(t *lateTxn) bool {
		return t.has(func(op clientv3.Op) bool { return op.IsDelete() && string(op.KeyBytes()) == key })
	})
}

func (l *Late) arm(match func(*lateTxn) bool) {
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
	resp, err := l.KV.Txn(ctx).If(h.cmps...).Then(h.thens...).Commit()
	if err != nil {
		t.Fatalf("late transaction: %v", err)
	}
	return resp.Succeeded
}

// Txn implements clientv3.KV.
func (l *Late) Txn(ctx context.Context) clientv3.Txn { return &lateTxn{l: l, ctx: ctx} }

type lateTxn struct {
	l           *Late
	ctx         context.Context
	cmps        []clientv3.Cmp
	thens, elss []clientv3.Op
}

func (t *lateTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.cmps = append(t.cmps, cs...); return t }
func (t *lateTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.thens = append(t.thens, ops...); return t }
func (t *lateTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.elss = append(t.elss, ops...); return t }

func (t *lateTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.hold() {
		return nil, context.DeadlineExceeded
	}
	return t.l.KV.Txn(t.ctx).If(t.cmps...).Then(t.thens...).Else(t.elss...).Commit()
}

// hold reports whether t is the transaction to hold back, and disarms.
func (t *lateTxn) hold() bool {
	l := t.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.armed == nil || !l.armed(t) {
		return false
	}
	l.armed, l.held = nil, t
	return true
}

// has reports whether an operation of t's Then matches.
func (t *lateTxn) has(match func(clientv3.Op) bool) bool {
	for _, op := range t.thens {
		if match(op) {
			return true
		}
	}
	return false
}

var _ clientv3.KV = (*Late)(nil)
