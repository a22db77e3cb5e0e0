package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
)

// TestCluster_ReadyNamesTheEtcdItWaitsFor: a cluster node whose etcd
// refuses connections stays up, and /ready says what it waits for: the
// dependency (etcd), the endpoint and the error met there. Stopped while it
// waits, Run's error names them too.
func TestCluster_ReadyNamesTheEtcdItWaitsFor(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "http://" + l.Addr().String()
	l.Close() // nothing listens there: connections are refused
	srv, err := server.New(server.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0",
		Cluster: server.ClusterConfig{Endpoints: []string{ep}, NodeID: "a", Prefix: "/pd/"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	const refused = "connection refused"
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	deadline := time.After(60 * time.Second)
	var got server.Readiness
	for got.Dependency == "" {
		select {
		case err := <-done:
			t.Fatalf("Run = %v while etcd refuses connections, want it to wait and say so on /ready", err)
		case <-deadline:
			t.Fatalf("/ready never named the dependency it waits for; last %+v", got)
		case <-poll.C:
		}
		resp, err := http.Get("http://" + srv.HealthAddr().String() + "/ready")
		if err != nil {
			t.Fatalf("GET /ready while etcd refuses connections: %v (Run = %v)", err, <-done)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		code, body := resp.StatusCode, string(b)
		got = server.Readiness{}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("/ready body %q is not JSON: %v", body, err)
		}
		if code != 503 || got.Ready {
			t.Fatalf("/ready = %d %q while etcd refuses connections, want 503", code, body)
		}
	}
	if got.Dependency != "etcd" || got.Endpoint != ep || !strings.Contains(got.Error, refused) ||
		!strings.HasPrefix(got.Reason, server.ReasonWaitingForEtcd+": ") || !strings.Contains(got.Reason, ep) || !strings.Contains(got.Reason, refused) {
		t.Fatalf("/ready = %+v, want it waiting for etcd at %s, %s", got, ep, refused)
	}
	cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), ep) || !strings.Contains(err.Error(), refused) {
			t.Fatalf("Run stopped while waiting for etcd = %v, want an error naming %s and %q", err, ep, refused)
		}
	case <-time.After(waitFor):
		t.Fatal("Run did not return after its context ended")
	}
}
