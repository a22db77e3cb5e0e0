package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/participantd/participantd/cluster"
)

// Waiting for etcd at start.
//
// A cluster node whose etcd does not answer when it starts (etcd still
// starting, a wrong endpoint, a network partition) waits rather than exits:
// it retries the join with backoff, and /ready answers 503 with what it
// waits for (etcdWait): the dependency, the endpoint and the error met
// there. etcd's client says only "context deadline exceeded" about an
// endpoint it cannot reach, so the node dials each endpoint itself to name
// the cause (connection refused, no route, a name that does not resolve).
// It stops waiting when Run's context ends, with an error naming them too.
// An error that waiting does not cure (a restore in progress, the node id
// in use, credentials refused) ends the start at once, as before.

// Bounds of the pause between two attempts to join the cluster.
const (
	joinRetryMin = 500 * time.Millisecond
	joinRetryMax = 15 * time.Second
)

// probeTimeout bounds each endpoint's connection attempt of diagnoseEtcd.
const probeTimeout = time.Second

// etcdWait is why the node is still waiting for etcd: the endpoint found
// failing first, what failed there, and the whole diagnosis (every failing
// endpoint), as /ready says it.
type etcdWait struct {
	endpoint string
	err      string
	detail   string
	since    time.Time
}

// joinCluster starts the cluster node on cli, waiting while etcd does not
// answer (see above).
func (s *Server) joinCluster(ctx context.Context, cli *clientv3.Client, endpoints []string, opts cluster.Options) (*cluster.Node, error) {
	pause := joinRetryMin
	for attempt := 1; ; attempt++ {
		node, err := cluster.Start(ctx, cli, opts)
		if err == nil {
			if w := s.etcdWaiting.Swap(nil); w != nil {
				s.log.Info().Dur("waited", time.Since(w.since)).Msg("etcd answers; joined the cluster")
			}
			return node, nil
		}
		if ctx.Err() != nil {
			if w := s.etcdWaiting.Load(); w != nil {
				return nil, w.stopped(ctx.Err())
			}
			return nil, fmt.Errorf("server: join the cluster: %w", err)
		}
		if !etcdUnavailable(err) {
			return nil, fmt.Errorf("server: join the cluster: %w", err)
		}
		w := diagnoseEtcd(ctx, endpoints, err)
		if prev := s.etcdWaiting.Load(); prev != nil {
			w.since = prev.since
		}
		s.etcdWaiting.Store(&w)
		wait := pause/2 + rand.N(pause/2)
		s.log.Warn().Str("etcd", w.endpoint).Str("error", w.err).Int("attempt", attempt).Dur("retry_in", wait).
			Msg("waiting for etcd: the node joins the cluster once it answers; /ready says why it is not ready")
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, w.stopped(ctx.Err())
		}
		pause = min(2*pause, joinRetryMax)
	}
}

// stopped is the error of a join stopped by cause (Run's context ending)
// while it waited for w.
func (w *etcdWait) stopped(cause error) error {
	return fmt.Errorf("server: join the cluster: stopped after waiting %s for %s: %w", time.Since(w.since).Round(time.Second), w.detail, cause)
}

// etcdUnavailable reports whether err is etcd not answering (a call that
// timed out, an endpoint unreachable, no leader), which waiting may cure,
// rather than an answer.
func etcdUnavailable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rpctypes.ErrNoLeader) ||
		errors.Is(err, rpctypes.ErrTimeout) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) {
		return true
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch se.GRPCStatus().Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		}
	}
	return false
}

// diagnoseEtcd says why etcd did not answer a call that failed with err:
// it connects to each endpoint (TCP, or its unix socket) within
// probeTimeout and names the ones that fail with their error; when every
// endpoint accepts a connection, etcd itself did not answer there (TLS,
// a member without quorum), and the first endpoint is named with err.
func diagnoseEtcd(ctx context.Context, endpoints []string, err error) etcdWait {
	w := etcdWait{since: time.Now()}
	var parts []string
	for _, ep := range endpoints {
		network, addr := endpointAddr(ep)
		d := net.Dialer{Timeout: probeTimeout}
		c, derr := d.DialContext(ctx, network, addr)
		if derr == nil {
			c.Close()
			continue
		}
		msg := derr.Error()
		var oe *net.OpError
		if errors.As(derr, &oe) && oe.Err != nil {
			// "dial tcp ADDR: connect: connection refused" names the
			// address the endpoint already names.
			msg = oe.Err.Error()
		}
		if w.endpoint == "" {
			w.endpoint, w.err = ep, msg
		}
		parts = append(parts, fmt.Sprintf("etcd %s: %s", ep, msg))
	}
	if w.endpoint == "" && len(endpoints) > 0 {
		w.endpoint, w.err = endpoints[0], err.Error()
		parts = append(parts, fmt.Sprintf("etcd %s: %s", w.endpoint, w.err))
	}
	w.detail = strings.Join(parts, "; ")
	return w
}

// endpointAddr returns the network and address an etcd client endpoint
// dials: http(s)://host:port and host:port over TCP, unix(s)://path over a
// unix socket.
func endpointAddr(ep string) (network, addr string) {
	scheme, rest, found := strings.Cut(ep, "://")
	if !found {
		return "tcp", ep
	}
	switch strings.ToLower(scheme) {
	case "unix", "unixs":
		return "unix", rest
	}
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		return "tcp", u.Host
	}
	return "tcp", rest
}
