package cluster_test

import (
	"math/rand/v2"
	"testing"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// etcdBackend makes etcd stores laid out as cluster mode lays them out
// (one scope per conversation), each run under a prefix of its own. A
// crash closes the store without flushing, which loses what was staged as
// a process crash does, and opens a new store on the same prefix.
func etcdBackend() participanttest.Backend {
	open := func(pfx string) *etcdstore.Store {
		return etcdstore.Open(shared.Client, etcdstore.Options{Prefix: pfx, Scope: cluster.Scope})
	}
	return participanttest.Backend{
		Fresh: func(faultstore.TB) store.DurableStore { return open(prefix()) },
		Crash: func(t faultstore.TB, st store.DurableStore) store.DurableStore {
			es := st.(*etcdstore.Store)
			if err := es.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return open(es.Prefix())
		},
		Release: func(t faultstore.TB, st store.DurableStore) {
			if err := st.(*etcdstore.Store).Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		},
	}
}

// TestCrashCutOverEtcd runs participant's crash-cut loop over the etcd
// store: the workload is cut at a store operation, the store crashes, and
// a new store on the same prefix must satisfy the same invariants as over
// the memory store (participanttest's package doc). It cuts at every
// operation; -short cuts at every fourth from a random offset, so that
// successive short runs cover different points.
func TestCrashCutOverEtcd(t *testing.T) {
	stride := uint64(1)
	if testing.Short() {
		stride = 4
	}
	offset := rand.Uint64N(stride)
	t.Logf("stride %d, offset %d", stride, offset)
	runs := participanttest.CutLoop{Backend: etcdBackend(), Stride: stride, Offset: offset}.Run(t)
	if runs < 10 {
		t.Fatalf("the loop checked %d runs; the workload should make far more store operations", runs)
	}
	t.Logf("checked %d runs", runs)
}

// TestCrashCutOverEtcd_TokenWindow runs participanttest.WindowWorkload
// through the same loop over etcd: the token floor and the deletions of
// forgotten tokens' entries are staged in the conversation's scope and
// committed by its flushes, and a cut anywhere leaves every answered tell
// replayed or token_expired, never committed again. -short cuts at every
// fourth operation from a random offset.
func TestCrashCutOverEtcd_TokenWindow(t *testing.T) {
	stride := uint64(1)
	if testing.Short() {
		stride = 4
	}
	offset := rand.Uint64N(stride)
	t.Logf("stride %d, offset %d", stride, offset)
	runs := participanttest.CutLoop{Backend: etcdBackend(), Stride: stride, Offset: offset,
		Workload: participanttest.WindowWorkload, Completed: participanttest.CheckForgotten}.Run(t)
	if runs < 10 {
		t.Fatalf("the loop checked %d runs; the workload should make far more store operations", runs)
	}
	t.Logf("checked %d runs", runs)
}
