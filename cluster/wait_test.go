package cluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestCluster_WaitingForTheOwnerSaysWhy: while etcd is down no node can
// serve a conversation; a tell that waits for it out of its context says
// why, from what the node answered, and OnWait says that it is waiting
// for the conversation's owner.
func TestCluster_WaitingForTheOwnerSaysWhy(t *testing.T) {
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	d := startDaemon(t, server.Config{DrainTimeout: time.Second, Cluster: server.ClusterConfig{
		Endpoints: etcd.Endpoints(), NodeID: "w", Prefix: "/wait/", LeaseTTL: 2 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waited := make(chan error, 1)
	opts := fastCluster
	opts.DiscardDeliveries = true
	opts.OnWait = func(conv uint64, why error) {
		if conv == 43 {
			select {
			case waited <- why:
			default:
			}
		}
	}
	cl, err := client.DialCluster(ctx, []string{d.srv.Addr().String()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cred, err := cl.Enroll(ctx, 43)
	if err != nil {
		t.Fatal(err)
	}
	etcd.Stop(0)
	tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
	defer tcancel()
	_, err = cl.Tell(tctx, cred, []byte("while etcd is down"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Tell while etcd is down = %v, want the context's deadline", err)
	}
	if want := "waiting for the owner of conversation 43: node " + d.srv.Addr().String(); !strings.Contains(err.Error(), want) {
		t.Errorf("Tell while etcd is down = %q, want it to say %q and what the node answered", err, want)
	}
	select {
	case why := <-waited:
		t.Logf("OnWait: %v; the tell: %v", why, err)
	default:
		t.Errorf("OnWait was not called while the tell waited for the owner")
	}
}
