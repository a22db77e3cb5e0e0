package cluster_test

import (
	"context"
	"flag"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// etcdBackend makes etcd stores laid out as cluster mode lays them out
// (one scope per conversation), each run under a prefix of its own. A
// crash closes the store without flushing, which loses what was staged as
// a process crash does, and opens a new store on the same prefix.
//
// Every store reads through a lagging member (etcdtest.Lag, one per run
// and kept across its crashes, its seed drawn from seed), and fences the
// scopes of conversations 1 to fencedConvs with a claim of its own, as a
// node does when it claims a conversation after a failover: the reads of
// a fenced scope are the serializable ones a lagging member answers, so a
// store that reads its own scope older than what it committed, or than
// what the previous store committed before the claim, shows as an answer
// the invariants refuse.
//
// maxTxnOps, if not 0, is the stores' Options.MaxTxnOps: small, a
// conversation's commit no longer fits one transaction and is cut along
// its log of writes (etcdstore's doc, Order).
func etcdBackend(t *testing.T, seed uint64, maxTxnOps int) faultstore.Backend {
	var (
		mu             sync.Mutex
		lags           = make(map[string]*etcdtest.Lagging)
		stale, refused uint64
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("lagging members (seeds from %d, -lag.seed to rerun a cut loop): %d reads answered stale, %d refused as future revisions", seed, stale, refused)
	})
	open := func(t faultstore.TB, pfx string) *etcdstore.Store {
		mu.Lock()
		lag := lags[pfx]
		if lag == nil {
			lag = etcdtest.Lag(shared.Client.KV, seed+uint64(len(lags)))
			lags[pfx] = lag
		}
		mu.Unlock()
		st := etcdstore.OpenKV(lag, etcdstore.Options{Prefix: pfx, Scope: cluster.Scope, ScanScope: cluster.ScanScope, MaxTxnOps: maxTxnOps})
		claimConvs(t, st, pfx)
		return st
	}
	return faultstore.Backend{
		Fresh: func(t faultstore.TB) store.DurableStore { return open(t, prefix()) },
		Crash: func(t faultstore.TB, st store.DurableStore) store.DurableStore {
			es := st.(*etcdstore.Store)
			if err := es.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return open(t, es.Prefix())
		},
		Release: func(t faultstore.TB, st store.DurableStore) {
			if err := st.(*etcdstore.Store).Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			mu.Lock()
			pfx := st.(*etcdstore.Store).Prefix()
			stale, refused = stale+lags[pfx].Stale(), refused+lags[pfx].Refused()
			delete(lags, pfx)
			mu.Unlock()
		},
	}
}

// fencedConvs is how many conversations (1, 2, …) etcdBackend fences:
// more than the workloads use.
const fencedConvs = 16

// claimConvs claims conversations 1 to fencedConvs for st as a node's
// claims would: the previous claims go, new ones are created (new create
// revisions, so a transaction of the previous store can no longer
// commit), and st fences each scope with its claim.
func claimConvs(t faultstore.TB, st *etcdstore.Store, pfx string) {
	rev := reclaimConvs(t, pfx)
	for c := range fencedConvs {
		sc := strconv.Itoa(c + 1)
		st.SetFence(sc, etcdstore.Fence{Key: pfx + "own/" + sc, CreateRevision: rev})
	}
}

// reclaimConvs deletes the claims of conversations 1 to fencedConvs under
// pfx and creates them again, as another node's claims would be, and
// returns their create revision.
func reclaimConvs(t faultstore.TB, pfx string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	own := pfx + "own/"
	if _, err := shared.Client.Delete(ctx, own, clientv3.WithPrefix()); err != nil {
		t.Fatalf("release claims: %v", err)
	}
	var puts []clientv3.Op
	for c := range fencedConvs {
		puts = append(puts, clientv3.OpPut(own+strconv.Itoa(c+1), "claim"))
	}
	resp, err := shared.Client.Txn(ctx).Then(puts...).Commit()
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return resp.Header.Revision
}

var lagSeed = flag.Uint64("lag.seed", 0, "first seed of the etcd cut loops' lagging members; 0 picks one")

// cutLagSeed returns the first seed of a cut loop's lagging members.
func cutLagSeed() uint64 {
	if *lagSeed != 0 {
		return *lagSeed
	}
	return rand.Uint64()
}

// etcdCutLoop runs participanttest's cut loop for workload (nil: the
// cut workload) over the etcd store, with lagging members, and completed
// on a run the cut left complete: at every store operation, or, with
// -short, at every fourth from a random offset, so that successive short
// runs cover different points.
func etcdCutLoop(t *testing.T, workload func(store.DurableStore, *[]participanttest.Answered) error, completed func(faultstore.TB, store.DurableStore)) {
	t.Helper()
	etcdCutLoopTxns(t, workload, completed, 0)
}

// etcdCutLoopTxns is etcdCutLoop over stores whose transactions hold at
// most maxTxnOps operations (0: etcd's default).
func etcdCutLoopTxns(t *testing.T, workload func(store.DurableStore, *[]participanttest.Answered) error, completed func(faultstore.TB, store.DurableStore), maxTxnOps int) {
	t.Helper()
	stride := uint64(1)
	if testing.Short() {
		stride = 4
	}
	offset := rand.Uint64N(stride)
	t.Logf("stride %d, offset %d", stride, offset)
	runs := participanttest.CutLoop{Backend: etcdBackend(t, cutLagSeed(), maxTxnOps), Stride: stride, Offset: offset,
		Workload: workload, Completed: completed}.Run(t)
	if runs < 10 {
		t.Fatalf("the loop checked %d runs; the workload should make far more store operations", runs)
	}
	t.Logf("checked %d runs", runs)
}

// TestCrashCutOverEtcd runs participant's crash-cut loop over the etcd
// store: the workload is cut at a store operation, the store crashes, and
// a new store on the same prefix must satisfy the same invariants as over
// the memory store (participanttest's package doc).
func TestCrashCutOverEtcd(t *testing.T) {
	etcdCutLoop(t, nil, nil)
}

// TestCrashCutOverEtcd_SmallTransactions runs the same loop over stores
// whose transactions hold at most 3 compares and 3 writes: every commit
// larger than a tell's (some 650 in a full loop) is cut along the
// conversation's log over several transactions, and every invariant holds
// as over whole commits. The store's own test fails each transaction of a
// cut commit (etcdstore, TestStore_AScopeCutOverTransactionsKeepsItsOrder).
func TestCrashCutOverEtcd_SmallTransactions(t *testing.T) {
	etcdCutLoopTxns(t, nil, nil, 3)
}

// TestCrashCutOverEtcd_TokenWindow runs participanttest.WindowWorkload
// through the same loop over etcd: the token floor and the deletions of
// forgotten tokens' entries are staged in the conversation's scope and
// committed by its flushes, and a cut anywhere leaves every answered tell
// replayed or token_expired, never committed again.
func TestCrashCutOverEtcd_TokenWindow(t *testing.T) {
	etcdCutLoop(t, participanttest.WindowWorkload, participanttest.CheckForgotten)
}

// TestCrashCutOverEtcd_MaxUnackedAge runs participanttest.ReleaseWorkload,
// whose compaction passes commit Release rows for records a deaf recipient
// never acknowledged, through the same loop over etcd: the Release row,
// the trims after it and the recipient's compacted notice meet every cut
// point in the conversation's scope.
func TestCrashCutOverEtcd_MaxUnackedAge(t *testing.T) {
	etcdCutLoop(t, participanttest.ReleaseWorkload, participanttest.CheckReleased)
}
