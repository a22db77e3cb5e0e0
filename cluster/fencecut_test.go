package cluster_test

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// thief counts the transactions that write; just before the one its
// Trigger fires on, it has every claim of the prefix taken by another node
// (steal: reclaimConvs), and then sends that transaction all the same:
// etcd refuses it on its fence. Every other call passes through.
type thief struct {
	etcdtest.Trigger
	steal func()
}

func (k *thief) commit(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
	if t.Writes() && k.Hit() {
		k.steal()
	}
	return t.Send()
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
		th := &thief{steal: func() { reclaimConvs(t, pfx) }}
		th.Arm(k) // the k-th writing transaction, counting from 1
		st := etcdstore.OpenKV(etcdtest.Hook(shared.Client.KV, etcdtest.Hooks{Txn: th.commit}), opts)
		claimConvs(t, st, pfx)
		var log []participanttest.Answered
		werr := participanttest.CutWorkload(st, &log)
		st.Close()
		next := etcdstore.Open(shared.Client, opts)
		claimConvs(t, next, pfx)
		participanttest.CheckInvariants(prefixedTB{t, fmt.Sprintf("claims taken before transaction %d: ", k)}, next, log)
		next.Close()
		runs++
		if !th.Fired() {
			if k < 10 {
				t.Fatalf("the workload made %d writing transactions; it should make far more", k-1)
			}
			if werr != nil {
				t.Fatalf("no claim taken (%d writing transactions): the workload failed: %v", k-1, werr)
			}
			break
		}
		if werr == nil {
			t.Fatalf("claims taken before transaction %d: the workload finished without a failure", k)
		}
	}
	t.Logf("checked %d runs", runs)
}
