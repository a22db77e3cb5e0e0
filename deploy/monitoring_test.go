// Package deploy holds the tests of the deployment files beside it: the
// Grafana dashboard and the Prometheus rules must name only metrics the
// server exports, every series they read must exist from start, and every
// alert must link its runbook in docs/runbooks.md.
package deploy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// metricName matches a participantd metric in a PromQL expression.
var metricName = regexp.MustCompile(`\bparticipantd_[a-z0-9_]+\b`)

// TestMonitoring_NamesOnlyExportedMetrics scrapes a running single node and
// a running cluster node, after enough traffic that every labelled series
// exists, and checks that each metric the dashboard and the alert rules
// name is one of theirs (a histogram's _bucket, _sum and _count included).
func TestMonitoring_NamesOnlyExportedMetrics(t *testing.T) {
	referenced := map[string][]string{} // metric -> files naming it
	for _, f := range []string{"grafana/participantd.json", "prometheus/alerts.yml", "prometheus/alerts_test.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".json") {
			var d any
			if err := json.Unmarshal(b, &d); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
		for _, m := range metricName.FindAllString(string(b), -1) {
			if !slices.Contains(referenced[m], f) {
				referenced[m] = append(referenced[m], f)
			}
		}
	}
	if len(referenced) < 20 {
		t.Fatalf("found only %d metric names in the dashboard and rules: is the pattern wrong?", len(referenced))
	}

	exported := map[string]bool{}
	for _, body := range []string{scrapeSingle(t), scrapeCluster(t)} {
		for _, line := range strings.Split(body, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			exported[strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]] = true
		}
	}
	for m, files := range referenced {
		if !exported[m] {
			t.Errorf("%s, named in %s, is not exported", m, strings.Join(files, ", "))
		}
	}
}

// scrapeSingle runs a single node with a wrong admin token presented, a
// connection refused, a tell, and a checkpoint and compaction pass, and
// returns its /metrics.
func scrapeSingle(t *testing.T) string {
	h := run(t, server.Config{
		AdminToken: "admin-secret", MaxConnections: 1,
		CheckpointInterval: 10 * time.Millisecond, CheckpointRows: 1,
	})
	traffic(t, h)
	// A second connection while the first is open: refused overloaded.
	nc, err := net.Dial("tcp", h.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, nc)
	nc.Close()
	req, _ := http.NewRequest("GET", "http://"+h.HealthAddr().String()+"/unloadable-conversations", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	// Wait for a checkpoint and a compaction pass to end.
	for deadline := time.Now().Add(30 * time.Second); ; {
		body := get(t, h, "/metrics")
		if strings.Contains(body, server.MetricCheckpointPasses+`{outcome="ok"}`) &&
			strings.Contains(body, server.MetricCompactionPasses+`{outcome="ok"}`) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint and compaction pass within 30s:\n%s", body)
		}
		time.Sleep(20 * time.Millisecond) // polling a background pass, not synchronizing
	}
}

// scrapeCluster runs a cluster node over a one-member etcd, tells through
// it, and returns its /metrics.
func scrapeCluster(t *testing.T) string {
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	h := run(t, server.Config{Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: "a", Prefix: "/pd/", LeaseTTL: 2 * time.Second}})
	traffic(t, h)
	return get(t, h, "/metrics")
}

// run starts a server on loopback and stops it at the end of the test.
func run(t *testing.T, cfg server.Config) *server.Server {
	t.Helper()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.HealthListen = "127.0.0.1:0"
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	}
	return srv
}

// traffic enrolls and tells once, leaving the connection open.
func traffic(t *testing.T, srv *server.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, srv.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cred, err := c.Enroll(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tell(ctx, cred, []byte("hello")); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, srv *server.Server, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + srv.HealthAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
