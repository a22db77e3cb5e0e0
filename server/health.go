package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/participantd/participantd/participant"
)

// Health endpoints.
//
//	GET /health                    200 while the process serves HTTP
//	GET /ready                     200 {"ready":true} once reconciled and accepting; else 503
//	                               {"ready":false,"reason":"..."}, reason one of Readiness's
//	                               (starting, waiting for etcd: ..., draining, store
//	                               failed: ..., lease lost, etcd unreachable: ...); while
//	                               waiting for etcd also "dependency", "endpoint", "error"
//	GET /metrics                   Prometheus text format (no conversation ids)
//	GET /unloadable-conversations  {"count": n}; with the admin token (Authorization: Bearer)
//	                               also "conversations": [{"conversation_id", "class", "reason"}];
//	                               503 before the service is open
//	GET /debug/pprof/...           Go's profiles, only with Config.Pprof (--pprof) and the admin
//	                               token; seconds at most MaxProfileSeconds; no cmdline
//	POST /admin/backup             see admin.go (only with an admin token)
//	GET /admin/conversations/{id}  see admin_conversation.go (only with an admin token)
//
// Every endpoint but /health and /ready answers only requests whose Host
// header is an IP literal, localhost or one of Config.HealthHosts (421
// otherwise): a web page that rebinds its own name to this listener's
// address gets nothing from it. A request that presents a wrong admin
// token is refused 401, logged (at most one line a second) and counted in
// participantd_admin_auth_failures_total.
func (s *Server) healthHandler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Pprof {
		mux.Handle("GET /debug/pprof/", s.adminOnly(capSeconds(http.HandlerFunc(pprof.Index))))
		mux.Handle("GET /debug/pprof/profile", s.adminOnly(capSeconds(http.HandlerFunc(pprof.Profile))))
		mux.Handle("GET /debug/pprof/symbol", s.adminOnly(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("GET /debug/pprof/trace", s.adminOnly(capSeconds(http.HandlerFunc(pprof.Trace))))
		// The command line may carry secrets (--auth-token): never served.
		mux.HandleFunc("GET /debug/pprof/cmdline", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "not served: the command line may hold secrets", http.StatusNotFound)
		})
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		st := s.readiness(r.Context())
		w.Header().Set("Content-Type", "application/json")
		if !st.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(st)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	unloadable := func(w http.ResponseWriter, r *http.Request, authorized bool) {
		svc, ok := s.openService(w)
		if !ok {
			return
		}
		list := svc.Unloadable()
		w.Header().Set("Content-Type", "application/json")
		if !authorized {
			json.NewEncoder(w).Encode(struct {
				Count int `json:"count"`
			}{len(list)})
			return
		}
		slices.SortFunc(list, func(a, b participant.Unloadable) int { return cmp.Compare(a.Conversation, b.Conversation) })
		if list == nil {
			list = []participant.Unloadable{}
		}
		json.NewEncoder(w).Encode(struct {
			Count         int                      `json:"count"`
			Conversations []participant.Unloadable `json:"conversations"`
		}{len(list), list})
	}
	mux.HandleFunc("GET /unloadable-conversations", func(w http.ResponseWriter, r *http.Request) {
		// Ids are for the operator: shown to the admin token only (an
		// audited admin read), and a request that presents a wrong one is
		// refused as at /admin.
		if r.Header.Get("Authorization") == "" {
			unloadable(w, r, false)
			return
		}
		s.adminOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { unloadable(w, r, true) })).ServeHTTP(w, r)
	})
	s.registerAdmin(mux)
	return s.checkHost(mux)
}

// MaxProfileSeconds caps the seconds parameter of the pprof endpoints: a
// CPU profile or a trace runs, and costs, that long.
const MaxProfileSeconds = 60

// capSeconds refuses a profile whose seconds parameter exceeds
// MaxProfileSeconds.
func capSeconds(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if sec, err := strconv.ParseFloat(v, 64); err != nil || sec > MaxProfileSeconds {
				http.Error(w, fmt.Sprintf("seconds must be a number of at most %d", MaxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// checkHost refuses requests whose Host header names anything but an IP
// literal, localhost or one of Config.HealthHosts, except /health and
// /ready, which say nothing worth rebinding a name for (and which probes
// send with whatever name they know the pod by).
func (s *Server) checkHost(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" && r.URL.Path != "/ready" && !s.hostAllowed(r.Host) {
			http.Error(w, "unknown host name; add it to --health-hosts", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a Host header value may reach the health
// listener's endpoints.
func (s *Server) hostAllowed(hostport string) bool {
	host, safe := rebindSafeHost(hostport)
	if safe {
		return true
	}
	for _, name := range s.cfg.HealthHosts {
		if strings.EqualFold(strings.TrimSuffix(name, "."), host) {
			return true
		}
	}
	return false
}

// rebindSafeHost returns the host of a Host header value, lower-cased and
// without a trailing dot, and whether it is a name no web page can rebind
// to this listener: an IP literal, localhost or a name under .localhost.
// Any other name must be listed by the operator (the health listener's
// --health-hosts, the WebSocket listener's --ws-allowed-origins).
func rebindSafeHost(hostport string) (host string, safe bool) {
	host = hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return host, true
	}
	return host, host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// checkHealthExposure refuses Config.AdminRemote, which serves the admin
// endpoints and pprof to peers beyond loopback, on a health listener bound
// beyond loopback (addr) without TLS (hasTLS): they hand out the node's
// data (a cluster backup holds the cluster secret) to whoever has the
// token, which must then not travel in the clear. Without AdminRemote they
// answer loopback peers only, whatever the listener's address
// (requireAdmin), so that probes and Prometheus may reach the listener
// while the admin endpoints stay inside the host (or the pod).
func checkHealthExposure(cfg Config, addr net.Addr, hasTLS bool) error {
	if (cfg.AdminToken == "" && !cfg.Pprof) || isLoopback(addr) || !cfg.AdminRemote {
		return nil
	}
	what := "the admin endpoints (admin-token)"
	if cfg.AdminToken == "" || cfg.Pprof {
		what = "the admin endpoints and pprof (admin-token, pprof)"
	}
	switch {
	case !hasTLS:
		return fmt.Errorf("server: admin-remote: %s beyond loopback need TLS on the health listener (health-tls-cert, health-tls-key): the admin token must not travel in the clear", what)
	}
	return nil
}

// isLoopback reports whether addr is a loopback address (an unspecified
// one, 0.0.0.0 or ::, listens on every interface: it is not).
func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// storeFailed returns the store's sticky failure once the service saw it,
// ErrStoreHung once the shutdown gave up on a store that stopped
// answering, and nil before (or before the service is open).
func (s *Server) storeFailed() error {
	if svc := s.svc.Load(); svc != nil {
		if err := svc.Failed(); err != nil {
			return err
		}
	}
	if s.hung.Load() {
		return ErrStoreHung
	}
	return nil
}

// Readiness is the body of /ready.
type Readiness struct {
	Ready bool `json:"ready"`
	// Reason says why not, empty when ready: "starting" (not yet
	// reconciled), "draining", "store failed: <error>", and in cluster
	// mode "waiting for etcd: etcd <endpoint>: <error>" (the start waits
	// for etcd to answer), "lease lost" (the ownership lease is not held)
	// or "etcd unreachable: <error>".
	Reason string `json:"reason,omitempty"`
	// Dependency, Endpoint and Error are set while the start waits for a
	// dependency, or a running node's etcd does not answer: which one
	// ("etcd"), the endpoint found failing first, and the error met there
	// (say "connect: connection refused").
	Dependency string `json:"dependency,omitempty"`
	Endpoint   string `json:"endpoint,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Reasons /ready gives when not ready; a failed store or an unreachable
// etcd adds ": " and the error.
const (
	ReasonStarting        = "starting"
	ReasonWaitingForEtcd  = "waiting for etcd"
	ReasonDraining        = "draining"
	ReasonStoreFailed     = "store failed"
	ReasonLeaseLost       = "lease lost"
	ReasonEtcdUnreachable = "etcd unreachable"
)

// readiness decides /ready: a failed store first (it outlasts everything
// else), then the server's own state, then the cluster's.
func (s *Server) readiness(ctx context.Context) Readiness {
	if err := s.storeFailed(); err != nil {
		return Readiness{Reason: ReasonStoreFailed + ": " + err.Error()}
	}
	if !s.ready.Load() {
		select {
		case <-s.readyCh:
			return Readiness{Reason: ReasonDraining}
		default:
			if w := s.etcdWaiting.Load(); w != nil {
				return Readiness{Reason: ReasonWaitingForEtcd + ": " + w.detail, Dependency: "etcd", Endpoint: w.endpoint, Error: w.err}
			}
			return Readiness{Reason: ReasonStarting}
		}
	}
	return s.clusterUnready(ctx)
}
