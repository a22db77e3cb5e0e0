package server

import (
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/participantd/participantd/internal/buildinfo"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// metrics is the server's Prometheus registry. It is also the service's
// Observer: one call per finished operation.
type metrics struct {
	reg *prometheus.Registry

	connsOpen    *prometheus.GaugeVec
	connsTotal   *prometheus.CounterVec
	refusedTotal *prometheus.CounterVec
	adminRefused prometheus.Counter
	badRequests  prometheus.Counter
	operations   *prometheus.CounterVec
	commitSecs   *prometheus.HistogramVec
	committed    prometheus.Counter
	deliveries   prometheus.Counter
	notices      prometheus.Counter
	// lifecycle reports checkpoints and compaction (lifecycle_metrics.go).
	lifecycle *lifecycleMetrics
	// stages is the requests' latency by stage (stage_metrics.go).
	stages *stageMetrics
}

// Metric names, for the documentation and the tests. Counters are raw
// (rates and ratios are the dashboard's to compute: operations per durable
// commit is rate(MetricCommittedOpsTotal) / rate(MetricStoreCommits));
// histograms are in seconds and named _duration_seconds.
const (
	MetricBuildInfo         = "participantd_build_info"
	MetricConnectionsOpen   = "participantd_connections_open"
	MetricConnectionsTotal  = "participantd_connections_total"
	MetricRefusedTotal      = "participantd_connections_refused_total"
	MetricAdminAuthFailures = "participantd_admin_auth_failures_total"
	MetricBadRequestsTotal  = "participantd_bad_requests_total"
	MetricOperationsTotal   = "participantd_operations_total"
	MetricCommitDuration    = "participantd_commit_duration_seconds"
	MetricCommittedOpsTotal = "participantd_store_committed_ops_total"
	MetricDeliveriesPushed  = "participantd_deliveries_pushed_total"
	MetricCompactedNotices  = "participantd_compacted_notices_total"
	MetricBatchesPipelined  = "participantd_batches_pipelined_total"
	MetricStoreFlushes      = "participantd_store_flushes_total"
	MetricStoreCommits      = "participantd_store_commits_total"
	MetricStoreAppends      = "participantd_store_appends_total"
	MetricConversations     = "participantd_conversations"
	MetricBindings          = "participantd_bindings"
	MetricStoreFileBytes    = "participantd_store_file_bytes"
	MetricStoreBytesInUse   = "participantd_store_bytes_in_use"
	MetricDataDirBytes      = "participantd_data_dir_bytes"
	MetricUnloadable        = "participantd_unloadable_conversations"
	MetricReady             = "participantd_ready"
	MetricStoreFailed       = "participantd_store_failed"
	// The bounds the gauges above are measured against, for alerts
	// (deploy/prometheus/alerts.yml): --max-data-bytes and --backlog-records.
	MetricMaxDataBytes        = "participantd_max_data_bytes"
	MetricBacklogRecordsLimit = "participantd_backlog_records_limit"

	MetricOutboundQueuedBytes = "participantd_outbound_queued_bytes"
	MetricPendingRequestBytes = "participantd_pending_request_bytes"
	MetricBacklogRecords      = "participantd_backlog_records"
	MetricBacklogBytes        = "participantd_backlog_bytes"
	MetricBacklogTotalBytes   = "participantd_backlog_total_bytes"
	MetricBacklogEvicted      = "participantd_backlog_evicted_bytes_total"
)

// Metrics of the backpressure on retained records (backlog_full).
const (
	MetricBacklogConversations = "participantd_backlog_conversations"
	MetricBacklogRefusals      = "participantd_backlog_refusals_total"
)

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		connsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricConnectionsOpen, Help: "Wire connections being served, by transport (tcp, ws).",
		}, []string{"transport"}),
		connsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricConnectionsTotal, Help: "Wire connections admitted since start, by transport (tcp, ws).",
		}, []string{"transport"}),
		refusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRefusedTotal, Help: "Connections rejected, by the reason of the rejected frame (tls_handshake: the TLS handshake failed or timed out, no frame).",
		}, []string{"reason"}),
		adminRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricAdminAuthFailures, Help: "Requests to admin-token endpoints of the health listener refused for a wrong or missing token.",
		}),
		badRequests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricBadRequestsTotal, Help: "Requests answered bad_request.",
		}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricOperationsTotal, Help: "Finished operations by kind (enroll, attach, tell, ack, detach, leave, end) and outcome (ok, replay, noop or an error code).",
		}, []string{"op", "outcome"}),
		commitSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricCommitDuration,
			Help:    "Time from start to answer of operations that committed (both barriers), by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"op"}),
		committed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCommittedOpsTotal, Help: "Operations that committed through the store (both barriers); per durable commit: rate of this over rate of " + MetricStoreCommits + ".",
		}),
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricDeliveriesPushed, Help: "Delivery frames pushed to connections.",
		}),
		notices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricCompactedNotices, Help: "Compacted notices pushed to bindings whose records were released unacknowledged (--max-unacked-age).",
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
		m.connsOpen, m.connsTotal, m.refusedTotal, m.adminRefused, m.badRequests, m.operations, m.commitSecs, m.committed, m.deliveries, m.notices,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricBatchesPipelined, Help: "Batches of a conversation decided while the batch before them was in flight, its commit not yet durable (pipelined batches, docs/DESIGN.md; none under pipeline-batches=false).",
		}, func() float64 {
			if svc := s.svc.Load(); svc != nil {
				return float64(svc.Pipelined())
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricStoreFlushes, Help: "Store Flush calls (group commit: many per store commit).",
		}, func() float64 { return float64(stats().Flushes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricStoreCommits, Help: "Store transactions made durable (fsync'd).",
		}, func() float64 { return float64(stats().Commits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricStoreAppends, Help: "Store appends.",
		}, func() float64 { return float64(stats().Appends) }),
		buildInfoGauge(),
		&contentsCollector{s: s},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricStoreFileBytes, Help: "Size on disk of the store file (" + StoreFile + "), bytes.",
		}, func() float64 {
			fi, err := os.Stat(filepath.Join(s.cfg.DataDir, StoreFile))
			if err != nil {
				return 0
			}
			return float64(fi.Size())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricStoreBytesInUse, Help: "Bytes the store holds, what --max-data-bytes caps: the store file's pages in use (its free pages, which compaction freed and writes reuse, not counted) plus the log not yet checkpointed into it; 0 in cluster mode.",
		}, func() float64 {
			if ref := s.st.Load(); ref != nil {
				if d, ok := ref.backend.(*dataDir); ok {
					return float64(inUse(d.st)())
				}
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricDataDirBytes, Help: "Size on disk of every file in the data directory (the store file, its logs, the node key), bytes.",
		}, func() float64 { return float64(dirBytes(s.cfg.DataDir)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricUnloadable, Help: "Conversations contained because they failed reconciliation.",
		}, func() float64 {
			if svc := s.svc.Load(); svc != nil {
				return float64(len(svc.Unloadable()))
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricReady, Help: "1 while the server is ready: started, not draining, its store not failed and, in cluster mode, its lease held (/ready checks too that etcd answers, which a scrape does not wait for).",
		}, func() float64 {
			if s.ready.Load() && s.storeFailed() == nil && s.leaseHeld() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricStoreFailed, Help: "1 once the store failed for good (a failed fsync, a full disk), or stopped answering during a shutdown (past store-close-timeout): the server drains and exits for a restart to reconcile.",
		}, func() float64 {
			if s.storeFailed() != nil {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricMaxDataBytes, Help: "max-data-bytes: the bytes in use (" + MetricStoreBytesInUse + ") past which enroll and tell are capacity_exceeded.",
		}, func() float64 { return float64(s.cfg.MaxDataBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricBacklogRecordsLimit, Help: "backlog-records: the records all conversations may retain together before those retaining the most are backlog_full.",
		}, func() float64 { return float64(s.cfg.BacklogRecords) }),
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
		// Backpressure on retained records.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricBacklogConversations, Help: "Loaded conversations retaining at least one record.",
		}, func() float64 { return float64(backlog().Conversations) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricBacklogRefusals, Help: "Operations refused backlog_full, by the limit that refused them: conversation (max-backlog-records), server (backlog-records) or client (client-share).",
			ConstLabels: prometheus.Labels{"limit": "conversation"},
		}, func() float64 { return float64(backlog().ConversationRefusals) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricBacklogRefusals, Help: "Operations refused backlog_full, by the limit that refused them: conversation (max-backlog-records), server (backlog-records) or client (client-share).",
			ConstLabels: prometheus.Labels{"limit": "server"},
		}, func() float64 { return float64(backlog().ServerRefusals) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: MetricBacklogRefusals, Help: "Operations refused backlog_full, by the limit that refused them: conversation (max-backlog-records), server (backlog-records) or client (client-share).",
			ConstLabels: prometheus.Labels{"limit": "client"},
		}, func() float64 { return float64(backlog().ClientRefusals) }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.lifecycle = newLifecycleMetrics(s)
	m.lifecycle.register(m.reg)
	m.stages = newStageMetrics()
	m.stages.register(m.reg)
	m.initSeries()
	return m
}

// Label values the labelled series are exported with from start, at 0, so
// that a dashboard panel or an alert (deploy/) has a series before the
// first event and rate() sees the first increase: each wire operation,
// with ok and the outcomes the alerts watch; each transport; each reason a
// connection is refused for.
var (
	seriesOps      = []string{"enroll", "attach", "tell", "ack", "detach", "leave", "end"}
	seriesOutcomes = []string{"ok", string(wire.CodeInDoubt), string(wire.CodeUnavailable), string(wire.CodeTokenInvalid), string(wire.CodeTokenExpired)}
	seriesRefused  = []wire.Reason{wire.ReasonUnsupportedVersion, wire.ReasonAuthFailed, wire.ReasonHelloRequired, wire.ReasonMalformed,
		wire.ReasonFrameTooLarge, wire.ReasonShuttingDown, wire.ReasonOverloaded, reasonTLSHandshake}
)

// initSeries creates the labelled series of seriesOps, seriesOutcomes and
// seriesRefused at 0.
func (m *metrics) initSeries() {
	for _, op := range seriesOps {
		for _, outcome := range seriesOutcomes {
			m.operations.WithLabelValues(op, outcome)
		}
		m.commitSecs.WithLabelValues(op)
	}
	for _, ws := range []bool{false, true} {
		m.connsOpen.WithLabelValues(transportLabel(ws))
		m.connsTotal.WithLabelValues(transportLabel(ws))
	}
	for _, r := range seriesRefused {
		m.refusedTotal.WithLabelValues(string(r))
	}
}

// Operation implements participant.Observer.
func (m *metrics) Operation(op, outcome string, d time.Duration) {
	m.operations.WithLabelValues(op, outcome).Inc()
	if outcome == "ok" {
		m.commitSecs.WithLabelValues(op).Observe(d.Seconds())
		m.committed.Inc()
	}
}

// buildInfoGauge is participantd_build_info: 1, labelled with the build.
func buildInfoGauge() prometheus.Gauge {
	bi := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricBuildInfo,
		Help: "Always 1; the labels say which build runs: version (announced in welcome), module_version, revision, goversion.",
		ConstLabels: prometheus.Labels{
			"version": Version, "module_version": bi.ModuleVersion, "revision": bi.Revision, "goversion": bi.GoVersion,
		},
	})
	g.Set(1)
	return g
}

// contentsCollector reports what the service holds, from one
// participant.Service.Stats per scrape.
type contentsCollector struct{ s *Server }

var (
	conversationsDesc = prometheus.NewDesc(MetricConversations,
		"Conversations the server knows of, by state: loaded (reconciled, in memory) or known (every conversation, loaded or not).", []string{"state"}, nil)
	bindingsDesc = prometheus.NewDesc(MetricBindings,
		"Bindings held by open connections.", nil, nil)
)

func (c *contentsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- conversationsDesc
	ch <- bindingsDesc
}

func (c *contentsCollector) Collect(ch chan<- prometheus.Metric) {
	var st participant.Stats
	if svc := c.s.svc.Load(); svc != nil {
		st = svc.Stats()
	}
	ch <- prometheus.MustNewConstMetric(conversationsDesc, prometheus.GaugeValue, float64(st.Loaded), "loaded")
	ch <- prometheus.MustNewConstMetric(conversationsDesc, prometheus.GaugeValue, float64(st.Conversations), "known")
	ch <- prometheus.MustNewConstMetric(bindingsDesc, prometheus.GaugeValue, float64(st.Bindings))
}

// dirBytes is the total size of the regular files under dir; files that
// vanish while it walks are skipped.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// transportLabel is the label of a connection's transport.
func transportLabel(ws bool) string {
	if ws {
		return "ws"
	}
	return "tcp"
}

func (m *metrics) connOpened(ws bool) {
	m.connsOpen.WithLabelValues(transportLabel(ws)).Inc()
	m.connsTotal.WithLabelValues(transportLabel(ws)).Inc()
}

func (m *metrics) connClosed(ws bool)         { m.connsOpen.WithLabelValues(transportLabel(ws)).Dec() }
func (m *metrics) refused(reason wire.Reason) { m.refusedTotal.WithLabelValues(string(reason)).Inc() }
func (m *metrics) badRequest()                { m.badRequests.Inc() }
func (m *metrics) adminAuthFailed()           { m.adminRefused.Inc() }
func (m *metrics) delivered()                 { m.deliveries.Inc() }
func (m *metrics) compactedNotice()           { m.notices.Inc() }
