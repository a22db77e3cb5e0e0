// Package etcdtest runs etcd members in-process (go.etcd.io/etcd/server/v3/embed)
// on loopback, for tests and for the cmd/etcd-dev helper: a Cluster of one or
// more members, each listening on free loopback ports with its data in a
// directory of its own, that a test can stop and restart member by member.
//
// Members keep fsync on (nothing here is faster than a real etcd because it
// cheats) and use the default limits of a real etcd (128 operations per
// transaction, 1.5 MiB per request), so that code tested here meets the
// limits it meets in production.
//
// A test member is never behind its peers, so the package also models the
// member that is: Lag wraps a clientv3.KV so that some serializable reads
// are answered as a member cut off from its peers answers them, at an old
// revision (Shared.LaggingClient gives a client whose KV does that); and
// a write that applies late: HoldLate wraps a clientv3.KV so that one
// transaction fails as a timeout does and reaches etcd only when the test
// sends it.
//
// Other faults a test injects with Hook: a KV whose transactions' commits
// (and Gets) a hook function decides, shown each transaction's compares
// and operations: run it, refuse it, lose its answer (Txn.Fail), hold it
// on a gate, or record it. Trigger picks the one to fail.
package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/participantd/participantd/internal/freeport"
)

// ErrStartTimeout reports a member that did not become ready in time.
var ErrStartTimeout = errors.New("etcdtest: member did not become ready")

// startTimeout bounds how long a member may take to become ready.
const startTimeout = 30 * time.Second

// Options configures Start. The zero value means one member, info logs off.
type Options struct {
	// Members is the number of members; zero means one.
	Members int
	// LogLevel is etcd's log level; empty means no logs at all.
	LogLevel string
}

// Cluster is a running set of embedded etcd members.
type Cluster struct {
	dir   string
	token string
	level string

	// mu guards members.
	mu      sync.Mutex
	members []*member
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd // nil while stopped
}

// Start starts a new cluster with its data under dir (one subdirectory per
// member) and waits until every member is ready. Close stops it.
//
// Ports are picked free and then bound by etcd, so another process can take
// one in between; Start then tries again with new ports (and a fresh data
// directory), a few times.
func Start(dir string, opts Options) (*Cluster, error) {
	var err error
	for attempt := range 5 {
		var c *Cluster
		c, err = start(filepath.Join(dir, fmt.Sprintf("try%d", attempt)), opts)
		if err == nil {
			return c, nil
		}
		// embed does not always wrap the listener's error.
		if !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
	}
	return nil, err
}

func start(dir string, opts Options) (*Cluster, error) {
	n := opts.Members
	if n <= 0 {
		n = 1
	}
	c := &Cluster{dir: dir, token: fmt.Sprintf("etcdtest-%d", time.Now().UnixNano()), level: opts.LogLevel}
	for i := range n {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(dir, fmt.Sprintf("m%d", i)),
			clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])},
			peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])},
		})
	}
	// Members of a new cluster wait for each other to elect a leader, so
	// they start concurrently.
	errs := make(chan error, n)
	for i := range c.members {
		go func() { errs <- c.startMember(i, embed.ClusterStateFlagNew) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		c.Close()
		return nil, first
	}
	return c, nil
}

func (c *Cluster) initialCluster() string {
	parts := make([]string, len(c.members))
	for i, m := range c.members {
		parts[i] = m.name + "=" + m.peerURL.String()
	}
	return strings.Join(parts, ",")
}

func (c *Cluster) startMember(i int, state string) error {
	m := c.members[i]
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = c.initialCluster()
	cfg.InitialClusterToken = c.token
	cfg.ClusterState = state
	cfg.Logger = "zap"
	if c.level == "" {
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	} else {
		cfg.LogLevel = c.level
	}
	cfg.ListenMetricsUrls = nil
	// Short ticks keep elections (after a member stops) within a test's
	// patience on a loaded machine.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	case <-time.After(startTimeout):
		e.Close()
		return fmt.Errorf("%w: %s", ErrStartTimeout, m.name)
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
	return nil
}

// Endpoints returns the client URLs of every member, running or not.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientURL.String()
	}
	return out
}

// Leader returns the index of the running member that leads, -1 when no
// running member does (an election is under way, or no quorum runs).
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.members {
		if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
			return i
		}
	}
	return -1
}

// Members returns the number of members.
func (c *Cluster) Members() int { return len(c.members) }

// Stop stops member i abruptly (its data stays); Restart starts it again.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	e := c.members[i].etcd
	c.members[i].etcd = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts the stopped member i again on its data and addresses and
// returns once it is ready (which needs a quorum of members running).
func (c *Cluster) Restart(i int) error {
	return c.startMember(i, embed.ClusterStateFlagExisting)
}

// Close stops every member. It is safe to call more than once.
func (c *Cluster) Close() {
	for i := range c.members {
		c.Stop(i)
	}
}

// freePorts returns n distinct loopback ports that were free a moment ago,
// below the ephemeral range where it can (freeport).
func freePorts(n int) ([]int, error) {
	ports, err := freeport.Ports(n)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: free port: %w", err)
	}
	return ports, nil
}
