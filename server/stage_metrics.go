package server

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// Metric names of a request's way through the server, stage by stage
// (docs/operations.md, "Where a request's time goes").
const (
	MetricStageDuration   = "participantd_request_stage_duration_seconds"
	MetricRequestDuration = "participantd_request_duration_seconds"
)

// The stages a request passes, in order, as the stage label names them.
// Their sum is the request's time from its frame read off the socket to
// its answer written to it (MetricRequestDuration); see
// participant.Stages for the service's part.
const (
	// stageWorker: read off the socket → started on the service (the
	// connection's worker for the conversation got to it).
	stageWorker = iota
	// stageTurn: started → its batch began (the conversation's turn).
	stageTurn
	// stageDecide: the batch's load, decisions, encoding and appends.
	stageDecide
	// stageOplog: barrier 1 on its own (a store that keeps no order of a
	// conversation's writes); not observed where barrier 1 shares
	// barrier 2's sync or commit (the log-first store, etcd).
	stageOplog
	// stageCommitWait: the group commit's wait for the commit carrying
	// the rows to be taken.
	stageCommitWait
	// stageCommit: that commit's write and sync.
	stageCommit
	// stagePrev: a batch decided while the one before it was in flight
	// (pipelined batches) waiting for that batch's outcome; taken out of
	// commit, or of decide for a batch that keeps the turn and waits
	// before its appends. Not observed for other batches.
	stagePrev
	// stagePublish: durable → outcome set (installation, wakes).
	stagePublish
	// stageWake: outcome set → answer queued for the socket (the
	// worker's wake-up, the answers before it).
	stageWake
	// stageWrite: queued → written to the socket.
	stageWrite
	numStages
)

var stageNames = [numStages]string{"worker", "turn", "decide", "oplog", "commit_wait", "commit", "prev", "publish", "wake", "write"}

// The wire operations, as the op label names them.
const (
	opEnroll = iota
	opAttach
	opTell
	opAck
	opDetach
	opLeave
	numOps
)

var opNames = [numOps]string{"enroll", "attach", "tell", "ack", "detach", "leave"}

// opIndex is m's index in opNames.
func opIndex(m wire.Operation) int {
	switch m.(type) {
	case *wire.Enroll:
		return opEnroll
	case *wire.Attach:
		return opAttach
	case *wire.Tell:
		return opTell
	case *wire.Ack:
		return opAck
	case *wire.Detach:
		return opDetach
	}
	return opLeave
}

// stageBuckets are 100 µs to 1.6 s by factors of √2, fine enough for a
// quantile read off them (histogram_quantile) to be within a fifth.
var stageBuckets = prometheus.ExponentialBuckets(0.0001, math.Sqrt2, 29)

// stageMetrics is the per-stage latency of requests: one histogram
// series per operation and stage, resolved once so that an observation
// looks nothing up.
type stageMetrics struct {
	stages, total *prometheus.HistogramVec
	by            [numOps]opStages
}

// opStages is one operation's series.
type opStages struct {
	stage [numStages]prometheus.Observer
	total prometheus.Observer
}

func newStageMetrics() *stageMetrics {
	m := &stageMetrics{
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricStageDuration,
			Help: "Time requests spent in each stage from their frame read to their answer written, by operation and stage: " +
				"worker (waiting for the connection's worker of the conversation), turn (for the conversation's turn), decide (the batch's decisions and appends), " +
				"oplog (barrier 1 on its own, where it does not share barrier 2's sync), commit_wait (the group commit's wait for the commit carrying the rows), commit (its write and sync), " +
				"prev (a batch decided while the one before it was in flight: the wait for that batch's outcome), publish (installation and wakes), wake (until the answer was queued for the socket), write (until it was written). One observation per request and stage passed.",
			Buckets: stageBuckets,
		}, []string{"op", "stage"}),
		total: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricRequestDuration,
			Help:    "Time from a request's frame read off the socket to its answer written to it, by operation.",
			Buckets: stageBuckets,
		}, []string{"op"}),
	}
	for op := range numOps {
		for st := range numStages {
			m.by[op].stage[st] = m.stages.WithLabelValues(opNames[op], stageNames[st])
		}
		m.by[op].total = m.total.WithLabelValues(opNames[op])
	}
	return m
}

func (m *stageMetrics) register(reg *prometheus.Registry) { reg.MustRegister(m.stages, m.total) }

// answered observes the stages of a request of operation op up to its
// answer's queueing: read is when its frame was read, started when its
// worker started it, queued when its answer was queued; st is the
// service's part.
func (m *stageMetrics) answered(op int, read, started, queued time.Time, st participant.Stages) {
	o := &m.by[op]
	o.stage[stageWorker].Observe(started.Sub(read).Seconds())
	if st.Done.IsZero() {
		// Refused before it reached a batch: all of it was the worker's
		// and the wake's.
		o.stage[stageWake].Observe(queued.Sub(started).Seconds())
		return
	}
	// Only the stages passed are observed: a batch that failed passed
	// none after the one it failed in (participant.Stages).
	o.stage[stageTurn].Observe(st.Turn.Seconds())
	o.stage[stageDecide].Observe(st.Decide.Seconds())
	if st.Split {
		o.stage[stageOplog].Observe(st.Oplog.Seconds())
	}
	if st.Barriers {
		o.stage[stageCommitWait].Observe(st.CommitWait.Seconds())
		o.stage[stageCommit].Observe(st.Commit.Seconds())
	}
	if st.Pipelined {
		o.stage[stagePrev].Observe(st.Prev.Seconds())
	}
	if st.Barriers && !st.Failed {
		o.stage[stagePublish].Observe(st.Publish.Seconds())
	}
	o.stage[stageWake].Observe(queued.Sub(st.Done).Seconds())
}

// written observes the write stage and the whole of a request whose
// answer, queued at queued, was written at now.
func (o *opStages) written(read, queued, now time.Time) {
	o.stage[stageWrite].Observe(now.Sub(queued).Seconds())
	o.total.Observe(now.Sub(read).Seconds())
}
