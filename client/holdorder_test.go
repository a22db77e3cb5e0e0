package client_test

import (
	"sync"
	"testing"

	"github.com/participantd/participantd/client"
)

// Two node Clients of one Cluster attach one participant, node 1's first
// (generation 2), then node 0's (generation 3, its re-attachment after a
// reconnect, superseding node 1's binding), and their reports of the
// bindings (Cluster.hold, the bound hook) arrive in the opposite order:
// node 1's answer waits in OnCredential, the application's callback that
// runs before it, while node 0's attach commits and is reported. The late
// report is of a binding already superseded: it must not take the
// participant from node 0's Client, which holds the binding, nor move the
// Cluster's record of its holder. Had it, node 0's Client would neither
// re-attach the participant nor report its binding gone when its
// connection ends, and the Cluster would never follow it.
func TestCluster_HoldsReportedOutOfOrder_TheNewestBindingStays(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	addrs := []string{srv.addr(), srv.addNode()}
	opts, reconnected := reconnectSignalled(fastClusterOpts)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	opts.OnCredential = func(cred client.Credential) {
		if cred.Generation == 2 {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
	}
	cl := dialClusterT(t, addrs, opts)
	node0, err := cl.NodeClient(ctx, addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	node1, err := cl.NodeClient(ctx, addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	// Enrolled through node 0's Client itself: the Cluster does not follow
	// the participant, so nothing but the two attaches below binds it.
	r, err := node0.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	attached := make(chan error, 1)
	go func() {
		_, err := node1.Attach(ctx, r)
		attached <- err
	}()
	<-entered // generation 2 committed on node 1; its report waits
	if n := srv.boundNode(1, r.Participant); n != 1 {
		close(release)
		t.Fatalf("the participant is bound on node %d, want node 1", n)
	}
	srv.dropNode(0)
	<-reconnected // node 0's Client re-attached it, and reported it
	if n := srv.boundNode(1, r.Participant); n != 0 {
		close(release)
		t.Fatalf("the participant is bound on node %d, want node 0 (re-attached by its Client)", n)
	}
	newest, ok := node0.Credential(1, r.Participant)
	if !ok || newest.Generation != 3 {
		close(release)
		t.Fatalf("node 0's Client holds %+v, %v; want generation 3", newest, ok)
	}
	close(release)
	if err := <-attached; err != nil {
		t.Fatalf("node 1's Attach = %v", err)
	}
	if got, ok := node0.Credential(1, r.Participant); !ok || got.Generation != 3 {
		t.Errorf("after the late report of generation 2, node 0's Client holds %+v, %v; want the binding of generation 3 it holds", got, ok)
	}
	if h := cl.Holder(r); h != addrs[0] {
		t.Errorf("after the late report of generation 2, the Cluster records the participant held by %q, want node 0 (%s)", h, addrs[0])
	}
}
