package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
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
	srv, done, cancel := runNode(t, server.ClusterConfig{Endpoints: []string{ep}, NodeID: "a", Prefix: "/pd/"})
	defer cancel()

	const refused = "connection refused"
	got := waitNamedDependency(t, srv, done, "etcd refuses connections")
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

// holeProxy accepts connections to an etcd and, while it is a black hole,
// holds them without a byte either way, as a host that accepts and never
// answers (a hung etcd, a middlebox) does; once opened, it closes what it
// held and forwards each new connection to the etcd.
type holeProxy struct {
	l  net.Listener
	to string
	mu sync.Mutex
	// +checklocks:mu
	open bool
	// +checklocks:mu
	held []net.Conn
}

func newHoleProxy(t *testing.T, to string) *holeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holeProxy{l: l, to: strings.TrimPrefix(to, "http://")}
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.held {
			c.Close()
		}
	})
	go p.serve()
	return p
}

func (p *holeProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.held = append(p.held, c)
		open := p.open
		p.mu.Unlock()
		if !open {
			go io.Copy(io.Discard, c) // read, never answer
			continue
		}
		go func() {
			up, err := net.Dial("tcp", p.to)
			if err != nil {
				c.Close()
				return
			}
			go func() { io.Copy(up, c); up.Close() }()
			io.Copy(c, up)
			c.Close()
		}()
	}
}

// openUp ends the black hole: the connections it held are closed, the
// next ones reach etcd.
func (p *holeProxy) openUp() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.open = true
	for _, c := range p.held {
		c.Close()
	}
	p.held = nil
}

// TestCluster_AnEtcdThatAcceptsButNeverAnswersIsWaitedFor: a cluster node
// whose etcd accepts its connections and never answers (not refused: the
// dial succeeds, every call hangs) does not hang its start: each join
// attempt ends at the node's own timeout, /ready answers 503 naming etcd,
// the endpoint and what its client said; once etcd answers, the node joins
// and is ready without a restart.
func TestCluster_AnEtcdThatAcceptsButNeverAnswersIsWaitedFor(t *testing.T) {
	etcd := startEtcd(t)
	hole := newHoleProxy(t, etcd.Endpoints()[0])
	ep := "http://" + hole.l.Addr().String()
	srv, done, cancel := runNode(t, server.ClusterConfig{Endpoints: []string{ep}, NodeID: "a", Prefix: "/pd/", LeaseTTL: 2 * time.Second})
	defer cancel()
	got := waitNamedDependency(t, srv, done, "etcd never answers")
	// The endpoint accepts connections: the diagnosis names it with the
	// client's own error, the call that timed out.
	if got.Dependency != "etcd" || got.Endpoint != ep || !strings.Contains(got.Error, "deadline exceeded") ||
		!strings.HasPrefix(got.Reason, server.ReasonWaitingForEtcd+": ") || !strings.Contains(got.Reason, ep) {
		t.Fatalf("/ready = %+v, want it waiting for etcd at %s, a deadline exceeded", got, ep)
	}

	hole.openUp()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("Run = %v once etcd answers, want the node to join", err)
	case <-time.After(90 * time.Second): // a hang guard: gRPC's reconnection backoff
		t.Fatal("the node did not join once etcd answered")
	}
	resp, err := http.Get("http://" + srv.HealthAddr().String() + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/ready = %d once joined, want 200", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after a clean stop", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Run did not return after its context ended")
	}
}

// runNode starts a cluster node on cfg in the background; done receives
// Run's error, cancel stops it.
func runNode(t *testing.T, cfg server.ClusterConfig) (srv *server.Server, done chan error, cancel context.CancelFunc) {
	t.Helper()
	srv, err := server.New(server.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0", Cluster: cfg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	return srv, done, cancel
}

// waitNamedDependency polls srv's /ready until it names the dependency it
// waits for, failing the test if srv becomes ready or Run returns first,
// or if /ready answers anything but 503 not ready meanwhile; while says
// what etcd does, for the failure messages.
func waitNamedDependency(t *testing.T, srv *server.Server, done chan error, while string) server.Readiness {
	t.Helper()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	deadline := time.After(60 * time.Second) // a hang guard, not a bound under test
	var got server.Readiness
	for got.Dependency == "" {
		select {
		case err := <-done:
			t.Fatalf("Run = %v while %s, want it to wait and say so on /ready", err, while)
		case <-srv.Ready():
			t.Fatalf("ready while %s", while)
		case <-deadline:
			t.Fatalf("/ready never named the dependency it waits for; last %+v", got)
		case <-poll.C:
		}
		resp, err := http.Get("http://" + srv.HealthAddr().String() + "/ready")
		if err != nil {
			t.Fatalf("GET /ready while %s: %v", while, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		got = server.Readiness{}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("/ready body %q is not JSON: %v", b, err)
		}
		if resp.StatusCode != 503 || got.Ready {
			t.Fatalf("/ready = %d %q while %s, want 503", resp.StatusCode, b, while)
		}
	}
	return got
}
