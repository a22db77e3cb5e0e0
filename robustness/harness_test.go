package robustness_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/internal/daemontest"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// leaseTTL is every node's lease: failover takes about this long, and a
// pause or a partition longer than it loses the node's conversations.
const leaseTTL = 2 * time.Second

// readyWait bounds a node's start (a restarted node waits up to twice the
// lease for its previous registration to expire).
const readyWait = 20 * time.Second

// harness is one run's world: a 3-member etcd in this process, the
// participantd processes, and a toxiproxy in front of every connection
// a nemesis may cut: node i reaches each etcd member through a proxy of
// its own (so a partition isolates one node from etcd, not everyone), and
// clients reach node i through one proxy (its advertised address).
type harness struct {
	t      *testing.T
	dir    string
	bin    string
	prefix string
	etcd   *etcdtest.Cluster
	cli    *clientv3.Client // the checker's own, direct connection to etcd
	toxics *toxiproxy.ApiServer
	nodes  []*node
}

// node is one participantd process slot: restarted by the nemeses under
// the same id, data directory and addresses.
type node struct {
	h       *harness
	id      string
	listen  string             // the process's own wire address
	health  string             // its health listener
	front   *toxiproxy.Proxy   // clients -> node (advertised address)
	toEtcd  []*toxiproxy.Proxy // node -> each etcd member
	logPath string
	clock   string // the clock-offset file of the faulthook build

	// mu guards the fields below; exited is closed when cmd's process
	// ended.
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	killed  bool    // the harness ends cmd's process
	crashes []crash // every process that ended by itself
}

// crash is a node process that ended without the harness ending it.
type crash struct {
	at    time.Time
	state string // its exit status
}

// newHarness starts etcd, the proxies and n nodes, and registers their
// teardown.
func newHarness(t *testing.T, dir, bin string, n int) *harness {
	t.Helper()
	h := &harness{t: t, dir: dir, bin: bin, prefix: "/robustness/"}
	// etcd logs only what ends it (a fatal exits the test binary: say why).
	c, err := etcdtest.Start(filepath.Join(dir, "etcd"), etcdtest.Options{Members: 3, LogLevel: "panic"})
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	h.etcd = c
	t.Cleanup(c.Close)
	h.cli, err = clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.cli.Close() })
	h.toxics = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	for i := range n {
		h.nodes = append(h.nodes, h.newNode(fmt.Sprintf("n%d", i+1)))
	}
	for _, nd := range h.nodes {
		if err := nd.start(); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// newNode creates a node slot, its clock file and its proxies; the
// process is started by start. Cleanup stops the process, then the proxies
// (cleanups run last-registered first; etcd's was registered before).
func (h *harness) newNode(id string) *node {
	t := h.t
	t.Helper()
	nd := &node{h: h, id: id, listen: daemontest.FreeAddr(t), health: daemontest.FreeAddr(t)}
	nd.logPath = filepath.Join(h.dir, "node-"+nd.id+".log")
	nd.clock = filepath.Join(h.dir, "clock-"+nd.id)
	if err := os.WriteFile(nd.clock, []byte("0s"), 0o600); err != nil {
		t.Fatal(err)
	}
	nd.front = h.proxy(nd.id+"-front", nd.listen)
	for m, ep := range h.etcd.Endpoints() {
		u, err := url.Parse(ep)
		if err != nil {
			t.Fatal(err)
		}
		nd.toEtcd = append(nd.toEtcd, h.proxy(fmt.Sprintf("%s-etcd%d", nd.id, m), u.Host))
	}
	t.Cleanup(func() {
		nd.front.Stop()
		for _, p := range nd.toEtcd {
			p.Stop()
		}
	})
	t.Cleanup(nd.kill)
	return nd
}

func (h *harness) proxy(name, upstream string) *toxiproxy.Proxy {
	h.t.Helper()
	p := toxiproxy.NewProxy(h.toxics, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		h.t.Fatalf("proxy %s: %v", name, err)
	}
	return p
}

// seeds are the clients' addresses of every node.
func (h *harness) seeds() []string {
	out := make([]string, len(h.nodes))
	for i, nd := range h.nodes {
		out[i] = nd.front.Listen
	}
	return out
}

// start runs the node's process and waits for /ready; startOn does so
// on another etcd prefix.
func (nd *node) start() error {
	return nd.startOn(nd.h.prefix)
}

func (nd *node) startOn(prefix string) error {
	logf, err := os.OpenFile(nd.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	eps := make([]string, len(nd.toEtcd))
	for i, p := range nd.toEtcd {
		eps[i] = "http://" + p.Listen
	}
	cmd := exec.Command(nd.h.bin,
		"--data", filepath.Join(nd.h.dir, "data-"+nd.id),
		"--listen", nd.listen, "--health-listen", nd.health,
		"--advertise", nd.front.Listen,
		"--etcd-endpoints", strings.Join(eps, ","), "--etcd-prefix", prefix,
		"--node-id", nd.id, "--lease-ttl", leaseTTL.String(),
		"--log-level", "info", "--log-format", "json")
	// A long retain keeps every row, so that the checker reads the whole
	// history; a token window makes the clock offsets matter.
	cmd.Env = append(os.Environ(),
		"PARTICIPANTD_DRAIN_TIMEOUT=2s",
		"PARTICIPANTD_RETAIN=1h",
		"PARTICIPANTD_TOKEN_WINDOW=10m",
		"PDTEST_CLOCK_OFFSET_FILE="+nd.clock)
	cmd.Stdout, cmd.Stderr = logf, logf
	fmt.Fprintf(logf, "{\"robustness\":\"start %s\",\"time\":%q}\n", nd.id, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	nd.mu.Lock()
	nd.cmd, nd.exited, nd.killed = cmd, exited, false
	nd.mu.Unlock()
	go func() {
		cmd.Wait()
		logf.Close()
		nd.mu.Lock()
		if !nd.killed {
			nd.crashes = append(nd.crashes, crash{time.Now(), cmd.ProcessState.String()})
		}
		nd.mu.Unlock()
		close(exited)
	}()
	if err := daemontest.WaitReady(nd.health, exited, readyWait); err != nil {
		return fmt.Errorf("node %s: %w (see %s)", nd.id, err, nd.logPath)
	}
	return nil
}

// signal sends sig to the running process; it reports false when none runs.
func (nd *node) signal(sig syscall.Signal) bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.runningLocked() && nd.cmd.Process.Signal(sig) == nil
}

// kill SIGKILLs the process and waits for it to end. It also ends the
// process at the end of a run: SIGKILL, not a drain, so that teardown
// takes no time and depends on nothing.
func (nd *node) kill() {
	nd.mu.Lock()
	nd.killed = true
	exited := nd.exited
	nd.mu.Unlock()
	nd.signal(syscall.SIGCONT) // a paused process dies as well, but say so
	nd.signal(syscall.SIGKILL)
	if exited != nil {
		<-exited
	}
}

// stop sends SIGTERM, as a supervisor's stop does, and waits for the
// process to end: it drains, releases its conversations and exits. It
// returns the process's exit status, or an error when none ran.
func (nd *node) stop() (*os.ProcessState, error) {
	nd.mu.Lock()
	if !nd.runningLocked() {
		nd.mu.Unlock()
		return nil, fmt.Errorf("SIGTERM %s: not running", nd.id)
	}
	nd.killed = true // the harness ends it: not a crash
	cmd, exited := nd.cmd, nd.exited
	err := cmd.Process.Signal(syscall.SIGTERM)
	nd.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("SIGTERM %s: %w", nd.id, err)
	}
	<-exited
	return cmd.ProcessState, nil
}

// crashed returns every process of the node that ended by itself, though
// a restart (a kill nemesis's) brought the node back since: each is a
// finding.
func (nd *node) crashed() []crash {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return slices.Clone(nd.crashes)
}

// running reports whether the process is alive.
func (nd *node) running() bool {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.runningLocked()
}

// runningLocked is running with nd.mu held.
func (nd *node) runningLocked() bool {
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

// exitStatus describes how the process ended, for the report.
func (nd *node) exitStatus() string {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	switch {
	case nd.cmd == nil:
		return "never started"
	case nd.runningLocked():
		return "running"
	default: // Wait set ProcessState before exited closed
		return nd.cmd.ProcessState.String()
	}
}

// setClock writes the node's clock offset and tells the process to read it.
func (nd *node) setClock(d time.Duration) error {
	if err := os.WriteFile(nd.clock, []byte(d.String()), 0o600); err != nil {
		return err
	}
	nd.signal(syscall.SIGUSR2)
	return nil
}

// partitionProxy drops every byte through p, both ways, on the connections
// open now and on new ones, as a network partition does (the connections
// stay open and silent); heal removes it and closes the connections whose
// bytes were dropped.
func partitionProxy(ctx context.Context, p *toxiproxy.Proxy) (heal func(), err error) {
	for _, stream := range []string{"upstream", "downstream"} {
		body := fmt.Sprintf(`{"name":"partition-%s","type":"timeout","stream":%q,"attributes":{"timeout":0}}`, stream, stream)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil && !errors.Is(err, toxiproxy.ErrToxicAlreadyExists) {
			return nil, fmt.Errorf("partition %s: %w", p.Name, err)
		}
	}
	return func() {
		for _, stream := range []string{"upstream", "downstream"} {
			p.Toxics.RemoveToxic(ctx, "partition-"+stream)
		}
	}, nil
}
