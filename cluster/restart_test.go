package cluster_test

import (
	"context"
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
