package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// NodeIDFile holds the derived node id inside the data directory.
const NodeIDFile = "node.id"

// ClusterConfig turns cluster mode on (Endpoints set): the data lives in
// etcd, the node owns conversations under a lease and answers moved for
// the others (docs/DESIGN.md, "Cluster mode"). The zero value is single-node
// mode, on bbolt, unchanged.
type ClusterConfig struct {
	// Endpoints are the etcd client URLs; empty means single-node mode.
	Endpoints []string
	// Prefix is the etcd key prefix of the data set; default
	// etcdstore.DefaultPrefix.
	Prefix string
	// NodeID names this node; default: derived once and kept in the data
	// directory (NodeIDFile).
	NodeID string
	// Advertise is the wire address clients are sent to for this node's
	// conversations; default the wire listener's address.
	Advertise string
	// LeaseTTL is the ownership lease; default cluster.DefaultLeaseTTL.
	LeaseTTL time.Duration
	// CA, Cert and Key are PEM files for TLS to etcd (Cert and Key both or
	// neither; CA alone verifies the server only).
	CA, Cert, Key string
	// Username and Password authenticate to etcd when Username is set.
	Username, Password string
	// SealKeyFile, if set, holds the key that seals the cluster secret in
	// etcd (cluster.LoadSealKey, cluster Options.SealKey): every node of a
	// cluster is given the same file.
	SealKeyFile string
	// PreviousSealKeyFile, with SealKeyFile, holds the sealing key being
	// rotated out (cluster Options.PreviousSealKey): a secret sealed under
	// it is opened and sealed again under SealKeyFile's.
	PreviousSealKeyFile string
	// NoLeaderAffinity sends commits through the client on every endpoint
	// instead of a second client on the etcd leader (etcdstore
	// Options.DialLeader, docs/DESIGN.md "Cluster mode"); the zero value
	// keeps leader affinity on.
	NoLeaderAffinity bool
}

// ParseEndpoints splits a comma-separated list of etcd client URLs, as
// --etcd-endpoints takes it, dropping blanks and surrounding spaces.
func ParseEndpoints(list string) []string {
	var out []string
	for _, e := range strings.Split(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func (c ClusterConfig) enabled() bool { return len(c.Endpoints) > 0 }

func (c ClusterConfig) validate() error {
	if !c.enabled() {
		return nil
	}
	for _, e := range c.Endpoints {
		if strings.TrimSpace(e) == "" {
			return errors.New("server: etcd-endpoints: empty endpoint")
		}
	}
	if (c.Cert == "") != (c.Key == "") {
		return errors.New("server: etcd-cert and etcd-key go together")
	}
	return nil
}

// Client connects to the etcd cluster of c (endpoints, TLS, auth), as the
// server does in cluster mode; the offline tools connect the same way. The
// caller closes it.
func (c ClusterConfig) Client() (*clientv3.Client, error) {
	ecfg, err := c.clientConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("server: etcd client: %w", err)
	}
	return cli, nil
}

// clientConfig is the etcd client configuration of c: its endpoints, TLS
// and auth. Leader affinity dials with it, on the leader's endpoint alone.
func (c ClusterConfig) clientConfig() (clientv3.Config, error) {
	if err := c.validate(); err != nil {
		return clientv3.Config{}, err
	}
	if !c.enabled() {
		return clientv3.Config{}, errors.New("server: no etcd endpoints")
	}
	ecfg := clientv3.Config{
		Endpoints:   c.Endpoints,
		DialTimeout: 5 * time.Second,
		Username:    c.Username,
		Password:    c.Password,
		Logger:      zap.NewNop(),
	}
	if c.CA != "" || c.Cert != "" {
		tlsInfo := transport.TLSInfo{TrustedCAFile: c.CA, CertFile: c.Cert, KeyFile: c.Key}
		tc, err := tlsInfo.ClientConfig()
		if err != nil {
			return clientv3.Config{}, fmt.Errorf("server: etcd tls: %w", err)
		}
		tc.MinVersion = tls.VersionTLS12
		ecfg.TLS = tc
	}
	return ecfg, nil
}

// backend is what Run closes after the drain and what metrics read.
type backend interface {
	Stats() store.Stats
	Close() error
}

// backendRef boxes a backend for an atomic pointer.
type backendRef struct{ backend }

// clusterBackend is the cluster-mode store: the node (its lease, claims and
// fenced etcd store) and the etcd client, closed in that order after the
// drain ended every binding: first the ownerships are released so that
// other nodes take over at once.
type clusterBackend struct {
	node      *cluster.Node
	cli       *clientv3.Client
	abandoned atomic.Bool
}

func (b *clusterBackend) Stats() store.Stats { return b.node.Store().Stats() }

func (b *clusterBackend) Close() error {
	defer b.cli.Close()
	if b.abandoned.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := b.node.Release(ctx)
	if cerr := b.node.Close(); err == nil {
		err = cerr
	}
	return err
}

// Abandon stops the server as a crash would, for failover tests: in
// cluster mode the node stops keeping its lease alive and can commit
// nothing more (its ownerships stay in etcd until the lease expires), and
// every connection is cut. The caller then cancels Run's context: its drain
// closes the listeners and commits nothing. In single-node mode it only
// cuts the connections.
func (s *Server) Abandon() {
	if ref := s.st.Load(); ref != nil {
		if b, ok := ref.backend.(*clusterBackend); ok {
			b.abandoned.Store(true)
			b.node.Abandon()
		}
	}
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
}

// clusterState is what the health and wire code read of cluster mode.
type clusterState struct {
	node *cluster.Node
	cli  *clientv3.Client
}

// clusterOf returns the server's cluster state, nil in single-node mode.
func (s *Server) clusterOf() *clusterState { return s.cl.Load() }

// nodeID is welcome.node: the node id in cluster mode, else empty.
func (s *Server) nodeID() string {
	if cs := s.clusterOf(); cs != nil {
		return cs.node.ID()
	}
	return ""
}

// leaseHeld reports whether the node holds its ownership lease; always
// true in single-node mode.
func (s *Server) leaseHeld() bool {
	cs := s.clusterOf()
	return cs == nil || cs.node.LeaseHeld()
}

// clusterUnready is the cluster part of /ready: why the node is not ready
// (the lease is not held, or etcd does not answer: then which endpoint and
// what failed there, diagnoseEtcd), ready when it is. Always ready in
// single-node mode.
func (s *Server) clusterUnready(ctx context.Context) Readiness {
	cs := s.clusterOf()
	if cs == nil {
		return Readiness{Ready: true}
	}
	if !s.leaseHeld() {
		return Readiness{Reason: ReasonLeaseLost}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := cs.cli.Get(cctx, "health", clientv3.WithCountOnly())
	switch {
	case err == nil:
		return Readiness{Ready: true}
	case !etcdUnavailable(err):
		return Readiness{Reason: ReasonEtcdUnreachable + ": " + err.Error()}
	}
	w := s.etcdDiagnosis.Load()
	if w == nil || time.Since(w.since) > diagnoseEvery {
		d := diagnoseEtcd(ctx, s.cfg.Cluster.Endpoints, err)
		w = &d
		s.etcdDiagnosis.Store(w)
	}
	return Readiness{Reason: ReasonEtcdUnreachable + ": " + w.detail, Dependency: "etcd", Endpoint: w.endpoint, Error: w.err}
}

// diagnoseEvery is how long /ready reuses a diagnosis of an etcd that
// does not answer: a probe polling every few seconds then dials the
// endpoints at most that often, and a /ready answers within the Get's
// second instead of that plus a dial per endpoint.
const diagnoseEvery = 5 * time.Second

// openCluster joins the etcd cluster and opens the service on the node's
// fenced store, with the node as its Ownership.
func (s *Server) openCluster(ctx context.Context) (backend, *participant.Service, error) {
	cc := s.cfg.Cluster
	if err := os.MkdirAll(s.cfg.DataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("server: data directory: %w", err)
	}
	id := cc.NodeID
	if id == "" {
		var err error
		if id, err = loadOrCreateNodeID(s.cfg.DataDir); err != nil {
			return nil, nil, fmt.Errorf("server: node id: %w", err)
		}
	}
	advertise := cc.Advertise
	if advertise == "" {
		advertise = s.ln.Addr().String()
	}
	var sealKey, previousSealKey []byte
	if cc.SealKeyFile != "" {
		var err error
		if sealKey, err = cluster.LoadSealKey(cc.SealKeyFile); err != nil {
			return nil, nil, fmt.Errorf("server: %w", err)
		}
	}
	if cc.PreviousSealKeyFile != "" {
		if sealKey == nil {
			return nil, nil, errors.New("server: etcd-previous-secret-key-file is the key being rotated out: give the new one as etcd-secret-key-file too")
		}
		var err error
		if previousSealKey, err = cluster.LoadSealKey(cc.PreviousSealKeyFile); err != nil {
			return nil, nil, fmt.Errorf("server: %w", err)
		}
	}
	ecfg, err := cc.clientConfig()
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, nil, fmt.Errorf("server: etcd client: %w", err)
	}
	// The leader's client has the settings of cli (TLS, credentials),
	// on the leader's endpoint alone.
	var dialLeader func(context.Context, string) (*clientv3.Client, error)
	if !cc.NoLeaderAffinity {
		dialLeader = func(ctx context.Context, ep string) (*clientv3.Client, error) {
			c := ecfg
			c.Endpoints = []string{ep}
			c.Context = ctx
			return clientv3.New(c)
		}
	}
	obs := newClusterMetrics()
	node, err := s.joinCluster(ctx, cli, cc.Endpoints, cluster.Options{
		NodeID:     id,
		Advertise:  advertise,
		Prefix:     cc.Prefix,
		LeaseTTL:   cc.LeaseTTL,
		Logger:     s.cfg.Logger,
		Observer:   leaseObserver{obs, s},
		DialLeader: dialLeader,
		// Where an operator asking another node is sent for the status of
		// a conversation this node owns (admin_conversation.go).
		AdvertiseHealth: s.healthURL(advertise),
		SealKey:         sealKey,
		PreviousSealKey: previousSealKey,
	})
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	b := &clusterBackend{node: node, cli: cli}
	key, err := node.NodeKey(ctx)
	if err != nil {
		b.Close()
		return nil, nil, fmt.Errorf("server: cluster node key: %w", err)
	}
	obs.register(s.metrics.reg, node)
	opts := s.serviceOptions(key)
	opts.Ownership = node
	// Each token lookup is an etcd round trip, and the etcd store shares
	// concurrent reads in one request: a batch's lookups go together.
	opts.PrefetchTokens = true
	w := watch(node.Store())
	s.watched.Store(w)
	svc, err := participant.Open(ctx, w, opts)
	if err != nil {
		b.Close()
		return nil, nil, fmt.Errorf("server: open service: %w", err)
	}
	node.OnLost(svc.Forget)
	s.cl.Store(&clusterState{node: node, cli: cli})
	s.log.Info().Str("node", id).Str("advertise", advertise).Strs("etcd", cc.Endpoints).Msg("cluster mode")
	warnPlaintextEtcd(s.log, cc)
	return b, svc, nil
}

// warnPlaintextEtcd warns when cc reaches etcd without TLS, and again when
// it sends the etcd password that way.
func warnPlaintextEtcd(log zerolog.Logger, cc ClusterConfig) {
	plain := cc.plaintext()
	if len(plain) == 0 {
		return
	}
	log.Warn().Strs("etcd", plain).Msg("etcd endpoints without TLS: whoever can read or change the traffic to etcd has every conversation and the cluster secret (secret/node-key); use https:// endpoints and --etcd-ca")
	if cc.Password != "" {
		log.Warn().Strs("etcd", plain).Msg("the etcd password goes to endpoints without TLS, in the clear")
	}
}

// plaintext returns the endpoints of c that the etcd client reaches without
// TLS: http:// ones, and those without a scheme when no TLS file is set
// (with one, the client dials them over TLS). unix:// sockets stay on the
// host and are left out.
func (c ClusterConfig) plaintext() []string {
	var out []string
	for _, e := range c.Endpoints {
		switch scheme, _, found := strings.Cut(e, "://"); {
		case found && strings.EqualFold(scheme, "http"):
			out = append(out, e)
		case !found && c.CA == "" && c.Cert == "":
			out = append(out, e)
		}
	}
	return out
}

// loadOrCreateNodeID returns the node id kept in dir, creating a random one
// the first time, so that a restarted node keeps its identity.
func loadOrCreateNodeID(dir string) (string, error) {
	path := filepath.Join(dir, NodeIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if id == "" || strings.ContainsAny(id, "/ \t") {
			return "", fmt.Errorf("%s holds no valid node id", path)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := "node-" + hex.EncodeToString(r[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	if f, err := os.Open(tmp); err == nil {
		f.Sync()
		f.Close()
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	return id, nil
}

// Cluster metric names.
const (
	MetricOwnedConversations = "participantd_cluster_owned_conversations"
	MetricClaimsTotal        = "participantd_cluster_claims_total"
	MetricMovesTotal         = "participantd_cluster_moved_total"
	MetricLostLeasesTotal    = "participantd_cluster_lost_leases_total"
	MetricEtcdTxnLatency     = "participantd_cluster_etcd_txn_seconds"
	MetricLeaseHeld          = "participantd_cluster_lease_held"
)

// clusterMetrics is the node's cluster.Observer; the counters are read
// from the node's Stats.
type clusterMetrics struct {
	txn *prometheus.HistogramVec
}

func newClusterMetrics() *clusterMetrics {
	m := &clusterMetrics{txn: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricEtcdTxnLatency,
		Help:    "Latency of the etcd transactions that commit the store, by outcome (ok, refused).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"outcome"})}
	// Both outcomes exist from start, at 0 (deploy/start_test.go).
	m.txn.WithLabelValues("ok")
	m.txn.WithLabelValues("refused")
	return m
}

func (m *clusterMetrics) register(reg *prometheus.Registry, node *cluster.Node) {
	reg.MustRegister(m.txn,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricOwnedConversations, Help: "Conversations this node owns."},
			func() float64 { return float64(node.Stats().Owned) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: MetricClaimsTotal, Help: "Conversations claimed by this node."},
			func() float64 { return float64(node.Stats().Claims) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: MetricMovesTotal, Help: "Requests answered moved (another node owns the conversation)."},
			func() float64 { return float64(node.Stats().Moves) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: MetricLostLeasesTotal, Help: "Leases lost; each dropped every owned conversation."},
			func() float64 { return float64(node.Stats().LostLeases) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricLeaseHeld, Help: "1 while the node holds its lease."},
			func() float64 {
				if node.LeaseHeld() {
					return 1
				}
				return 0
			}),
	)
}

func (m *clusterMetrics) Claimed()      {}
func (m *clusterMetrics) Moved()        {}
func (m *clusterMetrics) LeaseLost(int) {}

func (m *clusterMetrics) Txn(d time.Duration, _ int, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "refused"
	}
	m.txn.WithLabelValues(outcome).Observe(d.Seconds())
}

// leaseObserver is the node's cluster.Observer: its metrics, and on a lost
// lease every connection holding a binding is ended with bye{lease_lost}
// (PROTOCOL.md, Cluster mode), so that a client that only reads follows
// its conversation to the next owner at once, not at its next binding
// check.
type leaseObserver struct {
	*clusterMetrics
	srv *Server
}

func (o leaseObserver) LeaseLost(owned int) {
	o.clusterMetrics.LeaseLost(owned)
	o.srv.leaseLost()
}
