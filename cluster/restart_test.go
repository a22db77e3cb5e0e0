package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
)

// countingLease counts the leases granted through it.
type countingLease struct {
	clientv3.Lease
	grants atomic.Int64
}

func (l *countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.grants.Add(1)
	return l.Lease.Grant(ctx, ttl)
}

// TestNode_RestartAfterCompactionWaitsWithoutSpinning: a node restarted
// while its previous process's node key is still live, after etcd
// compacted the revision that key was last written at, waits for the key
// to go as it does without compaction: the watch from that revision is
// canceled by etcd at once (compacted), which is no deletion, so the node
// reads the key again and watches from the current revision. It grants
// one lease that finds the key taken and one that registers, not one per
// canceled watch.
func TestNode_RestartAfterCompactionWaitsWithoutSpinning(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	old, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	old.Abandon() // SIGKILL: node/a stays until its lease expires
	var last int64
	for i := range 3 {
		resp, err := shared.Client.Put(ctx, fmt.Sprintf("%selsewhere/%d", pfx, i), "x")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	if _, err := shared.Client.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}

	cli := newClient(t)
	leases := &countingLease{Lease: cli.Lease}
	cli.Lease = leases
	n, err := cluster.Start(ctx, cli, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: time.Second, StartWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("restart after compaction: %v", err)
	}
	defer n.Close()
	if g := leases.grants.Load(); g > 2 {
		t.Fatalf("restart after compaction granted %d leases, want 2 (one finds node/a taken, one registers)", g)
	}
	resp, err := shared.Client.Get(ctx, pfx+"node/a")
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != n.CurrentLease() {
		t.Fatalf("Get(node/a) = %v, %v; want the new process's registration", resp, err)
	}
}

// TestNode_RestartAfterCompactionUnderALiveProcessIsRefused: a second
// process of node a started while the first still holds its node key,
// after etcd compacted the revision that key was written at, waits for
// the key within StartWait like any other (the compacted watch is no
// deletion, and the watch from the current revision sees none) and is
// refused ErrNodeIDInUse, having granted one lease, not one per canceled
// watch; the first process keeps its registration.
func TestNode_RestartAfterCompactionUnderALiveProcessIsRefused(t *testing.T) {
	pfx := prefix()
	ctx := context.Background()
	live, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	resp, err := shared.Client.Put(ctx, pfx+"elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}

	cli := newClient(t)
	leases := &countingLease{Lease: cli.Lease}
	cli.Lease = leases
	n, err := cluster.Start(ctx, cli, cluster.Options{NodeID: "a", Prefix: pfx, LeaseTTL: time.Second, StartWait: time.Second})
	if err == nil {
		n.Close()
		t.Fatal("a second process of node a started while the first holds its key")
	}
	if !errors.Is(err, cluster.ErrNodeIDInUse) {
		t.Fatalf("a second process of node a = %v, want ErrNodeIDInUse", err)
	}
	if g := leases.grants.Load(); g != 1 {
		t.Errorf("the refused start granted %d leases, want 1", g)
	}
	got, err := shared.Client.Get(ctx, pfx+"node/a")
	if err != nil || len(got.Kvs) != 1 || clientv3.LeaseID(got.Kvs[0].Lease) != live.CurrentLease() {
		t.Fatalf("Get(node/a) = %v, %v; want the live process's registration", got, err)
	}
}
