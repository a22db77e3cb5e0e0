package server

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/participantd/participantd/participant"
)

// Health endpoints.
//
//	GET /health                    200 while the process serves HTTP
//	GET /ready                     200 once reconciled and accepting; 503 before, and while draining;
//	                               in cluster mode also 503 while etcd does not answer or the lease is not held
//	GET /metrics                   Prometheus text format
//	GET /unloadable-conversations  {"count": n, "conversations": [{"conversation_id", "class", "reason"}]};
//	                               503 before the service is open
func (s *Server) healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
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
	return mux
}
