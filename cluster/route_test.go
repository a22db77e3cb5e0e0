package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// TestCluster_ClientFollowsMoved: a participant enrolled through node a is
// used through a Cluster that knows only node b: b answers moved{a}, and
// the Cluster attaches the participant on a with its latest credential and
// tells there; deliveries come back through a's connection.
func TestCluster_ClientFollowsMoved(t *testing.T) {
	pfx := prefix()
	cfg := func(id string) server.Config {
		return server.Config{Cluster: server.ClusterConfig{Endpoints: shared.Endpoints(), NodeID: id, Prefix: pfx, LeaseTTL: 5 * time.Second}}
	}
	a := startDaemon(t, cfg("a"))
	b := startDaemon(t, cfg("b"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := client.ClusterOptions{Options: client.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}

	viaA, err := client.DialCluster(ctx, []string{a.srv.Addr().String()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer viaA.Close()
	alice, err := viaA.Enroll(ctx, 77)
	if err != nil {
		t.Fatal(err)
	}
	viaB, err := client.DialCluster(ctx, []string{b.srv.Addr().String()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer viaB.Close()
	bob, err := viaB.Enroll(ctx, 77)
	if err != nil {
		t.Fatalf("Enroll through b (owner a): %v", err)
	}
	if _, err := viaB.Tell(ctx, bob, []byte("hi alice")); err != nil {
		t.Fatalf("Tell through b: %v", err)
	}
	for got := false; !got; {
		select {
		case d := <-viaA.Deliveries():
			got = d.Kind == wire.KindRecord && string(d.Payload) == "hi alice"
		case <-ctx.Done():
			t.Fatal("alice never got bob's record")
		}
	}
	// A participant enrolled elsewhere is attached on the owner, then told.
	cur, ok := viaA.Credential(alice.Conversation, alice.Participant)
	if !ok {
		t.Fatal("viaA holds no credential for alice")
	}
	viaB2, err := client.DialCluster(ctx, []string{b.srv.Addr().String()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer viaB2.Close()
	viaA.Close()
	if _, err := viaB2.Tell(ctx, cur, []byte("alice again")); err != nil {
		t.Fatalf("Tell with alice's credential through b: %v", err)
	}
}
