package server_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
	"github.com/participantd/participantd/wire"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// startEtcd runs a one-member etcd for the test.
func startEtcd(t *testing.T) *etcdtest.Cluster {
	t.Helper()
	c, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestCluster_MovedWelcomeNodeAndReady: two nodes over one etcd. Each
// welcome names its node; the node that enrolled a conversation serves it
// and the other answers moved with the owner's advertised address; /ready
// holds on both; the credential issued by one node verifies on the other
// once the owner drained and released the conversation.
func TestCluster_MovedWelcomeNodeAndReady(t *testing.T) {
	etcd := startEtcd(t)
	cfg := func(id string) server.Config {
		return server.Config{Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: id, Prefix: "/pd/", LeaseTTL: 2 * time.Second}}
	}
	a := start(t, cfg("a"))
	b := start(t, cfg("b"))

	ca, cb := a.dial(), b.dial()
	if ca.Welcome.Node != "a" || cb.Welcome.Node != "b" {
		t.Fatalf("welcome.node = %q, %q, want a, b", ca.Welcome.Node, cb.Welcome.Node)
	}
	if ca.Welcome.Incarnation == cb.Welcome.Incarnation {
		t.Fatalf("both nodes announce incarnation %d; connection ids would collide", ca.Welcome.Incarnation)
	}
	for _, h := range []*harness{a, b} {
		if code, body := h.get("/ready"); code != 200 {
			t.Fatalf("/ready = %d %q, want 200", code, body)
		}
	}
	cr := ca.enroll(42)
	ca.tell(cr, "hello")

	ans := cb.call(&wire.Tell{ID: cb.id(), Conversation: 42, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte("x")})
	e, ok := ans.(*wire.Error)
	if !ok || e.Code != wire.CodeMoved || e.Owner == nil || *e.Owner != a.srv.Addr().String() {
		t.Fatalf("tell on b answered %#v, want moved{owner: %s}", ans, a.srv.Addr())
	}
	if code, body := b.get("/metrics"); code != 200 || !strings.Contains(body, server.MetricMovesTotal+" 1") || !strings.Contains(body, server.MetricLeaseHeld+" 1") {
		t.Fatalf("b /metrics lacks the cluster metrics:\n%s", body)
	}

	// a drains: it ends its bindings, then releases; b takes over at once.
	if err := a.shutdown(); err != nil {
		t.Fatalf("a drained with %v", err)
	}
	re := cb.attach(cr)
	if re.gen != cr.gen+1 {
		t.Fatalf("attach on b: generation %d, want %d", re.gen, cr.gen+1)
	}
	cb.tell(re, "after the move")
}

// TestCluster_ReadySaysEtcdOrLease: /ready answers {"ready":true} while
// etcd answers, and once etcd is gone 503 with the reason: etcd
// unreachable, then lease lost once the lease expired, when the ready
// gauge is 0 too.
func TestCluster_ReadySaysEtcdOrLease(t *testing.T) {
	etcd := startEtcd(t)
	h := start(t, server.Config{Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: "a", Prefix: "/pd/", LeaseTTL: 2 * time.Second}})
	// etcd comes back before the shutdown (cleanups run last first), so
	// that the drain's release ends within the harness's wait instead of
	// waiting out its own timeouts against a stopped etcd.
	t.Cleanup(func() {
		if err := etcd.Restart(0); err != nil {
			t.Errorf("etcd restart: %v", err)
		}
	})
	if code, body := h.get("/ready"); code != 200 || strings.TrimSpace(body) != `{"ready":true}` {
		t.Fatalf("/ready = %d %q, want 200 {\"ready\":true}", code, body)
	}
	etcd.Stop(0)
	deadline := time.Now().Add(waitFor)
	for {
		code, body := h.get("/ready")
		var got server.Readiness
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("/ready body %q is not JSON: %v", body, err)
		}
		if code == 503 {
			if got.Ready || !(strings.HasPrefix(got.Reason, server.ReasonEtcdUnreachable+": ") || got.Reason == server.ReasonLeaseLost) {
				t.Fatalf("/ready with etcd stopped = %d %q, want ready false, reason etcd unreachable or lease lost", code, body)
			}
			if ep := etcd.Endpoints()[0]; got.Reason != server.ReasonLeaseLost &&
				(got.Dependency != "etcd" || got.Endpoint != ep || !strings.Contains(got.Error, "connection refused") || !strings.Contains(got.Reason, ep)) {
				t.Fatalf("/ready with etcd stopped = %d %q, want it to name etcd, %s and the connection refused", code, body, ep)
			}
			if got.Reason == server.ReasonLeaseLost {
				// The gauge says what /ready says, without asking etcd.
				if _, metrics := h.get("/metrics"); !strings.Contains(metrics, "\n"+server.MetricReady+" 0\n") {
					t.Fatalf("/metrics with the lease lost lacks %s 0", server.MetricReady)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready still %d %q %v after etcd stopped, want lease lost once the lease's TTL passed", code, body, waitFor)
		}
	}
}

// TestCluster_LeaseLossSaysByeToBoundConnections: when the node loses its
// lease, a connection holding a binding gets bye{lease_lost} and is closed
// at once, so that a client that only reads follows its conversation to
// the next owner without waiting for its binding check; a connection
// without a binding keeps being served.
func TestCluster_LeaseLossSaysByeToBoundConnections(t *testing.T) {
	etcd := startEtcd(t)
	h := start(t, server.Config{Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: "a", Prefix: "/pd/", LeaseTTL: 2 * time.Second}})
	reader, idle := h.dial(), h.dial()
	reader.enroll(42)

	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: waitFor})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	leases, err := cli.Leases(ctx)
	if err != nil || len(leases.Leases) == 0 {
		t.Fatalf("the node's lease: %v, %v", leases, err)
	}
	for _, l := range leases.Leases {
		if _, err := cli.Revoke(ctx, l.ID); err != nil {
			t.Fatalf("revoke: %v", err)
		}
	}
	if bye, ok := reader.next().(*wire.ServerBye); !ok || bye.Reason != wire.ByeLeaseLost {
		t.Fatalf("the bound connection got %#v, want bye{%s}", bye, wire.ByeLeaseLost)
	}
	reader.expectClosed()
	idle.ping()
}
