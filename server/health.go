package server

import (
	"cmp"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/participantd/participantd/participant"
)

// Health endpoints.
//
//	GET /health                    200 while the process serves HTTP
//	GET /ready                     200 once reconciled and accepting; 503 before, while draining,
//	                               and once the store failed ("store failed: ..."); in cluster
//	                               mode also 503 while etcd does not answer or the lease is not held
//	GET /metrics                   Prometheus text format
//	GET /unloadable-conversations  {"count": n, "conversations": [{"conversation_id", "class", "reason"}]};
//	                               503 before the service is open
//	GET /debug/pprof/...           Go's profiles, only with Config.Pprof (--pprof)
//	POST /admin/backup             see admin.go (only with an admin token)
func (s *Server) healthHandler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		if err := s.storeFailed(); err != nil {
			http.Error(w, "store failed: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !s.ready.Load() || !s.clusterReady(r.Context()) {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /unloadable-conversations", func(w http.ResponseWriter, r *http.Request) {
		svc := s.svc.Load()
		if svc == nil {
			http.Error(w, "not open yet", http.StatusServiceUnavailable)
			return
		}
		list := svc.Unloadable()
		slices.SortFunc(list, func(a, b participant.Unloadable) int { return cmp.Compare(a.Conversation, b.Conversation) })
		if list == nil {
			list = []participant.Unloadable{}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct {
			Count         int                      `json:"count"`
			Conversations []participant.Unloadable `json:"conversations"`
		}{len(list), list})
	})
	s.registerAdmin(mux)
	return mux
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
