package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/participantd/participantd/participant"
)

// Metric names of the background checkpoints and compaction (docs/DESIGN.md,
// Data lifecycle), from one participant.Service.Lifecycle per scrape and,
// for the pass durations, from participant.PassObserver.
const (
	MetricCheckpointPasses       = "participantd_checkpoint_passes_total"
	MetricCheckpointPassDuration = "participantd_checkpoint_pass_duration_seconds"
	MetricCheckpointsWritten     = "participantd_checkpoints_written_total"
	MetricCheckpointBytes        = "participantd_checkpoint_bytes_written_total"
	MetricCheckpointsSkipped     = "participantd_checkpoints_skipped_total"
	MetricCheckpointLastSuccess  = "participantd_checkpoint_last_success_timestamp_seconds"
	MetricCompactionPasses       = "participantd_compaction_passes_total"
	MetricCompactionPassDuration = "participantd_compaction_pass_duration_seconds"
	MetricCompactedRows          = "participantd_compacted_rows_total"
	MetricCompactedOplogBytes    = "participantd_compacted_oplog_bytes_total"
	MetricReceiptsWritten        = "participantd_receipts_written_total"
	MetricTokensForgotten        = "participantd_tokens_forgotten_total"
	MetricRecordsReleased        = "participantd_records_released_unacknowledged_total"
	MetricCompactionLastSuccess  = "participantd_compaction_last_success_timestamp_seconds"
	MetricConversationsPinned    = "participantd_conversations_pinned"
	MetricPassConversationFails  = "participantd_pass_conversation_failures_total"
)

var (
	checkpointPassesDesc = prometheus.NewDesc(MetricCheckpointPasses,
		"Checkpoint passes that ended, by outcome (ok, error: the store failed the pass; it is retried at the next interval).", []string{"outcome"}, nil)
	checkpointsWrittenDesc = prometheus.NewDesc(MetricCheckpointsWritten,
		"Conversation checkpoints made durable.", nil, nil)
	checkpointBytesDesc = prometheus.NewDesc(MetricCheckpointBytes,
		"Encoded bytes of the checkpoints made durable.", nil, nil)
	checkpointsSkippedDesc = prometheus.NewDesc(MetricCheckpointsSkipped,
		"Checkpoints due and not written, by reason: too_large (more than the store takes in one value), unreadable (the stored checkpoint does not decode), underivable (the stored rows do not derive: damage), not_durable (retried next pass), forgotten (the ownership was lost meanwhile).", []string{"reason"}, nil)
	checkpointLastDesc = prometheus.NewDesc(MetricCheckpointLastSuccess,
		"Unix time the last successful checkpoint pass ended; 0 before the first.", nil, nil)
	compactionPassesDesc = prometheus.NewDesc(MetricCompactionPasses,
		"Compaction passes that ended, by outcome (ok, error).", []string{"outcome"}, nil)
	compactedRowsDesc = prometheus.NewDesc(MetricCompactedRows,
		"Rows compaction removed, by stream kind (oplog, outbox).", []string{"stream"}, nil)
	compactedOplogBytesDesc = prometheus.NewDesc(MetricCompactedOplogBytes,
		"Stored bytes of the oplog rows compaction removed (outbox rows are trimmed unread, so their bytes are not counted; bbolt reuses the freed pages rather than shrinking the file).", nil, nil)
	receiptsWrittenDesc = prometheus.NewDesc(MetricReceiptsWritten,
		"Token receipts written for compacted rows (each keeps a retry's original answer).", nil, nil)
	tokensForgottenDesc = prometheus.NewDesc(MetricTokensForgotten,
		"Token index entries compaction deleted under --token-window: tokens older than the window, whose retries are refused token_expired.", nil, nil)
	recordsReleasedDesc = prometheus.NewDesc(MetricRecordsReleased,
		"Records given up before every recipient acknowledged them, under --max-unacked-age; each recipient that lost some gets a compacted notice ("+MetricCompactedNotices+").", nil, nil)
	compactionLastDesc = prometheus.NewDesc(MetricCompactionLastSuccess,
		"Unix time the last successful compaction pass ended; 0 before the first.", nil, nil)
	passConversationFailsDesc = prometheus.NewDesc(MetricPassConversationFails,
		"Steps of the background passes that failed one conversation while the pass went on with the others, by step (checkpoint, compaction, deletion): a damaged conversation (contained as store_corrupt) once, a transient failure once per attempt, retried with backoff.", []string{"step"}, nil)
	conversationsPinnedDesc = prometheus.NewDesc(MetricConversationsPinned,
		"Conversations holding a record some recipient has not acknowledged for longer than --retain, which keeps their history from compaction; as of the last compaction pass that visited every conversation (0 before one).", nil, nil)
)

// lifecycleMetrics reports the checkpoint and compaction passes: a
// collector over the service's Lifecycle snapshot, and the pass duration
// histograms, fed by the service as a participant.PassObserver.
type lifecycleMetrics struct {
	s                *Server
	ckSecs, compSecs prometheus.Histogram
}

func newLifecycleMetrics(s *Server) *lifecycleMetrics {
	// 1 ms to 2 min: a pass reads up to CheckpointPassRows rows.
	buckets := prometheus.ExponentialBuckets(0.001, 2, 18)
	return &lifecycleMetrics{
		s: s,
		ckSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricCheckpointPassDuration, Help: "Duration of checkpoint passes that ended (ok or error).", Buckets: buckets,
		}),
		compSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: MetricCompactionPassDuration, Help: "Duration of compaction passes that ended (ok or error).", Buckets: buckets,
		}),
	}
}

func (l *lifecycleMetrics) register(reg *prometheus.Registry) {
	reg.MustRegister(l, l.ckSecs, l.compSecs)
}

// pass records one pass's duration.
func (l *lifecycleMetrics) pass(kind participant.PassKind, d time.Duration) {
	switch kind {
	case participant.PassCheckpoint:
		l.ckSecs.Observe(d.Seconds())
	case participant.PassCompaction:
		l.compSecs.Observe(d.Seconds())
	}
}

// Pass implements participant.PassObserver.
func (m *metrics) Pass(kind participant.PassKind, d time.Duration, _ error) {
	m.lifecycle.pass(kind, d)
}

func (l *lifecycleMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{checkpointPassesDesc, checkpointsWrittenDesc, checkpointBytesDesc, checkpointsSkippedDesc,
		checkpointLastDesc, compactionPassesDesc, compactedRowsDesc, compactedOplogBytesDesc, receiptsWrittenDesc, recordsReleasedDesc,
		tokensForgottenDesc, compactionLastDesc, conversationsPinnedDesc, passConversationFailsDesc} {
		ch <- d
	}
}

func (l *lifecycleMetrics) Collect(ch chan<- prometheus.Metric) {
	var lc participant.Lifecycle
	lc.Pinned = -1
	if svc := l.s.svc.Load(); svc != nil {
		lc = svc.Lifecycle()
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	unix := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return float64(t.UnixNano()) / 1e9
	}
	counter(checkpointPassesDesc, lc.CheckpointPasses-lc.CheckpointPassesFailed, "ok")
	counter(checkpointPassesDesc, lc.CheckpointPassesFailed, "error")
	counter(checkpointsWrittenDesc, lc.CheckpointsWritten)
	counter(checkpointBytesDesc, lc.CheckpointBytes)
	for _, r := range participant.SkipReasons {
		counter(checkpointsSkippedDesc, lc.CheckpointsSkipped[r], r.String())
	}
	gauge(checkpointLastDesc, unix(lc.LastCheckpointPass))
	counter(compactionPassesDesc, lc.CompactionPasses-lc.CompactionPassesFailed, "ok")
	counter(compactionPassesDesc, lc.CompactionPassesFailed, "error")
	counter(compactedRowsDesc, lc.OplogRowsTrimmed, "oplog")
	counter(compactedRowsDesc, lc.OutboxRowsTrimmed, "outbox")
	counter(compactedOplogBytesDesc, lc.OplogBytesTrimmed)
	counter(receiptsWrittenDesc, lc.ReceiptsWritten)
	counter(tokensForgottenDesc, lc.TokensForgotten)
	counter(recordsReleasedDesc, lc.RecordsReleased)
	gauge(compactionLastDesc, unix(lc.LastCompactionPass))
	for _, st := range participant.ConversationSteps {
		counter(passConversationFailsDesc, lc.ConversationFailures[st], st.String())
	}
	// Exported from start, so that the dashboard's panel has a series:
	// 0 until a pass has visited every conversation.
	gauge(conversationsPinnedDesc, float64(max(lc.Pinned, 0)))
}
