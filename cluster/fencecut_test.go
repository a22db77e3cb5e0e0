package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/etcdstore"
)

// thief is a clientv3.KV that, just before its at-th transaction that
// writes (counting from 1), has every claim of the prefix taken by
// another node (reclaimConvs), and then sends that transaction all the
// same: etcd refuses it on its fence. Every other call passes through.
type thief struct {
	clientv3.KV
	steal func()

	// mu guards the fields below.
	mu sync.Mutex
	// +checklocks:mu
	at int
	// +checklocks:mu
	writes int
	// +checklocks:mu
	fired bool
}

func (k *thief) Txn(ctx context.Context) clientv3.Txn { return &thiefTxn{Txn: k.KV.Txn(ctx), k: k} }

// hasFired reports whether the claims were taken.
func (k *thief) hasFired() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fired
}

type thiefTxn struct {
	clientv3.Txn
	k      *thief
	writes bool
}

func (t *thiefTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }

func (t *thiefTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *thiefTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		t.writes = t.writes || op.IsPut() || op.IsDelete()
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *thiefTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.writes {
		t.k.mu.Lock()
		t.k.writes++
		fire := t.k.writes == t.k.at
		t.k.fired = t.k.fired || fire
		t.k.mu.Unlock()
		if fire {
			t.k.steal()
		}
	}
	return t.Txn.Commit()
}

// TestCrashCutOverEtcd_FenceLostBetweenTransactions runs participant's
// cut workload over etcd stores whose transactions hold at most 3
// compares and 3 writes, so that a conversation's commit is cut over
// several transactions (etcdstore's doc, Order), and has another node
// claim every conversation just before the workload's k-th writing
// transaction, for every k: a fence lost
// between two transactions of one commit, or before a commit's first.
// etcd refuses that transaction and every later one of the scope, so it
// holds a prefix of the scope's writes; the workload stops at the
// failure, and a store of the new owner, reconciling what etcd holds,
// meets every invariant of the crash cuts: each answered operation
// replays its answer, nothing unanswered is half stored. The store's own
// test takes the fence at each transaction of one cut commit
// (TestStore_AScopeCutOverTransactionsKeepsItsOrder, fence lost).
//
// It passed when written: every transaction of a cut commit compares the
// fence, a refused one fails the scope before the next is sent, and a
// batch answers only once its flush returned nil. It stays as the test
// that injects the fault.
func TestCrashCutOverEtcd_FenceLostBetweenTransactions(t *testing.T) {
	runs := 0
	for k := 1; ; k++ {
		pfx := prefix()
		opts := etcdstore.Options{Prefix: pfx, Scope: cluster.Scope, ScanScope: cluster.ScanScope, MaxTxnOps: 3}
		kv := &thief{KV: shared.Client.KV, at: k, steal: func() { reclaimConvs(t, pfx) }}
		st := etcdstore.OpenKV(kv, opts)
		claimConvs(t, st, pfx)
		var log []participanttest.Answered
		werr := participanttest.CutWorkload(st, &log)
		st.Close()
		next := etcdstore.Open(shared.Client, opts)
		claimConvs(t, next, pfx)
		participanttest.CheckInvariants(prefixedTB{t, fmt.Sprintf("claims taken before transaction %d: ", k)}, next, log)
		next.Close()
		runs++
		if !kv.hasFired() {
			if k < 10 {
				t.Fatalf("the workload made %d writing transactions; it should make far more", k-1)
			}
			if werr != nil {
				t.Fatalf("no claim taken (%d writing transactions): the workload failed: %v", k-1, werr)
			}
			break
		}
	}
	t.Logf("checked %d runs", runs)
}
