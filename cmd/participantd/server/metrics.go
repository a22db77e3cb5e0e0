package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// metrics is the server's Prometheus registry. It is also the service's
// Observer: one call per finished operation.
type metrics struct {
	reg *prometheus.Registry

	connsOpen    prometheus.Gauge
	connsTotal   prometheus.Counter
	refusedTotal *prometheus.CounterVec
	badRequests  prometheus.Counter
	operations   *prometheus.CounterVec
	commitSecs   *prometheus.HistogramVec
	committed    prometheus.Counter
	deliveries   prometheus.Counter

	// committedOps mirrors committed for the ops-per-commit ratio.
	committedOps atomic.Uint64
}

// Metric names, for the documentation and the tests.
const (
	MetricConnectionsOpen   = "participantd_connections_open"
	MetricConnectionsTotal  = "participantd_connections_total"
	MetricRefusedTotal      = "participantd_connections_refused_total"
	MetricBadRequestsTotal  = "participantd_bad_requests_total"
	MetricOperationsTotal   = "participantd_operations_total"
	MetricCommitLatency     = "participantd_commit_latency_seconds"
	MetricCommittedOpsTotal = "participantd_committed_operations_total"
	MetricDeliveriesPushed  = "participantd_deliveries_pushed_total"
	MetricStoreFlushes      = "participantd_store_flushes_total"
	MetricStoreCommits      = "participantd_store_commits_total"
	MetricStoreAppends      = "participantd_store_appends_total"
	MetricOpsPerFlush       = "participantd_ops_per_flush"
	MetricUnloadable        = "participantd_unloadable_conversations"
	MetricReady             = "participantd_ready"

	MetricOutboundQueuedBytes = "participantd_outbound_queued_bytes"
	MetricPendingRequestBytes = "participantd_pending_request_bytes"
	MetricBacklogRecords      = "participantd_backlog_records"
	MetricBacklogBytes        = "participantd_backlog_bytes"
	MetricBacklogTotalBytes   = "participantd_backlog_total_bytes"
	MetricBacklogEvicted      = "participantd_backlog_evicted_bytes_total"
)

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricConnectionsOpen, Help: "Wire connections being served.",
		}),
		connsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricConnectionsTotal, Help: "Wire connections admitted since start.",
		}),
		refusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRefusedTotal, Help: "Connections rejected, by the reason of the rejected frame.",
		}, []string{"reason"}),
		badRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricBadRequestsTotal, Help: "Requests answered bad_request.",
		}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricOperationsTotal, Help: "Finished operations by kind (enroll, attach, tell, ack, detach, leave, end) and outcome (ok, replay, noop or an error code).",
		}, []string{"op", "outcome"}),
		commitSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricCommitLatency,
			Help:    "Latency of operations that committed (both barriers), by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"op"}),
		committed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCommittedOpsTotal, Help: "Operations that committed.",
		}),
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricDeliveriesPushed, Help: "Delivery frames pushed to connections.",
		}),
	}
	stats := func() store.Stats {
		if st := s.st.Load(); st != nil {
			return st.Stats()
		}
		return store.Stats{}
	}
	backlog := func() participant.Backlog {
		if svc := s.svc.Load(); svc != nil {
			return svc.Backlog()
		}
		return participant.Backlog{}
	}
	m.reg.MustRegister(
		m.connsOpen, m.connsTotal, m.refusedTotal, m.badRequests, m.operations, m.commitSecs, m.committed, m.deliveries,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricStoreFlushes, Help: "Store Flush calls (group commit: many per store commit).",
		}, func() float64 { return float64(stats().Flushes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricStoreCommits, Help: "Store transactions made durable (fsync'd).",
		}, func() float64 { return float64(stats().Commits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricStoreAppends, Help: "Store appends.",
		}, func() float64 { return float64(stats().Appends) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricOpsPerFlush,
			Help: "Committed operations per durable store commit since start: " + MetricCommittedOpsTotal + " / " + MetricStoreCommits + ". Each operation needs two barriers, so 0.5 means no grouping.",
		}, func() float64 {
			c := stats().Commits
			if c == 0 {
				return 0
			}
			return float64(m.committedOps.Load()) / float64(c)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricUnloadable, Help: "Conversations contained because they failed reconciliation.",
		}, func() float64 {
			if svc := s.svc.Load(); svc != nil {
				return float64(len(svc.Unloadable()))
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricReady, Help: "1 while /ready answers 200.",
		}, func() float64 {
			if s.ready.Load() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricOutboundQueuedBytes, Help: "Bytes of frames queued for the connections' writers (bounded by max-outbound-bytes-total).",
		}, func() float64 { return float64(s.outBytes.inUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricPendingRequestBytes, Help: "Frame bytes of requests read and not yet answered (bounded by max-pending-bytes-total).",
		}, func() float64 { return float64(s.pendingBytes.inUse()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricBacklogRecords, Help: "Records retained in memory because a recipient has yet to acknowledge them (or one before them).",
		}, func() float64 { return float64(backlog().Records) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricBacklogBytes, Help: "Payload bytes of the retained records held in memory (bounded by backlog-memory).",
		}, func() float64 { return float64(backlog().MemoryBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricBacklogTotalBytes, Help: "Payload bytes of the retained records, in memory and read back from the store on delivery.",
		}, func() float64 { b := backlog(); return float64(b.MemoryBytes + b.EvictedBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricBacklogEvicted, Help: "Payload bytes dropped from memory past backlog-memory since start (each read back from the store when delivered).",
		}, func() float64 { return float64(backlog().EvictedTotal) }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Operation implements participant.Observer.
func (m *metrics) Operation(op, outcome string, d time.Duration) {
	m.operations.WithLabelValues(op, outcome).Inc()
	if outcome == "ok" {
		m.commitSecs.WithLabelValues(op).Observe(d.Seconds())
		m.committed.Inc()
		m.committedOps.Add(1)
	}
}

func (m *metrics) connOpened() {
	m.connsOpen.Inc()
	m.connsTotal.Inc()
}

func (m *metrics) connClosed()                { m.connsOpen.Dec() }
func (m *metrics) refused(reason wire.Reason) { m.refusedTotal.WithLabelValues(string(reason)).Inc() }
func (m *metrics) badRequest()                { m.badRequests.Inc() }
func (m *metrics) delivered()                 { m.deliveries.Inc() }
