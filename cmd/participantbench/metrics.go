package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// serverCounters are the server metrics the bench reads before and after
// the measured window.
type serverCounters struct {
	Commits   float64
	Flushes   float64
	Committed float64
	// CPUSeconds is the server process's user+system CPU time.
	CPUSeconds float64
	// Hists are the latency histograms of requests by stage (and whole),
	// by series (histKey).
	Hists map[histKey]*hist
}

// scrapeCounters reads the Prometheus text of http://addr/metrics and
// returns the store and commit counters. Unknown lines are skipped.
func scrapeCounters(ctx context.Context, addr string) (serverCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return serverCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return serverCounters{}, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return serverCounters{}, fmt.Errorf("scrape metrics: %s", resp.Status)
	}
	return parseCounters(resp.Body)
}

// parseCounters reads the Prometheus text exposition r (expfmt) and
// returns the counters and latency histograms the bench compares across
// its window; families it does not use are skipped.
func parseCounters(r io.Reader) (serverCounters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return serverCounters{}, fmt.Errorf("scrape metrics: %w", err)
	}
	c := serverCounters{Hists: make(map[histKey]*hist)}
	value := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.GetMetric()) == 0 {
			return 0
		}
		m := f.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue()
		}
		return m.GetUntyped().GetValue()
	}
	c.Commits = value("participantd_store_commits_total")
	c.Flushes = value("participantd_store_flushes_total")
	c.Committed = value("participantd_store_committed_ops_total")
	c.CPUSeconds = value("process_cpu_seconds_total")
	for _, name := range []string{stageMetric, requestMetric, etcdTxnMetric} {
		for _, m := range fams[name].GetMetric() {
			if k, ok := seriesKey(name, m); ok && m.GetHistogram() != nil {
				c.Hists[k] = histOf(m.GetHistogram())
			}
		}
	}
	return c, nil
}

// seriesKey names the series m of the histogram family name; false for a
// series the bench does not read (an etcd transaction that was refused).
func seriesKey(name string, m *dto.Metric) (histKey, bool) {
	var k histKey
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "op":
			k.op = l.GetValue()
		case "stage":
			k.stage = l.GetValue()
		case "outcome":
			if l.GetValue() != "ok" {
				return histKey{}, false
			}
		}
	}
	switch name {
	case requestMetric:
		k.stage = ""
	case etcdTxnMetric:
		k = etcdTxnKey
	}
	return k, true
}

// histOf is h's cumulative counts by upper bound, +Inf last.
func histOf(h *dto.Histogram) *hist {
	out := &hist{sum: h.GetSampleSum(), count: float64(h.GetSampleCount())}
	for _, b := range h.GetBucket() {
		out.les = append(out.les, b.GetUpperBound())
		out.counts = append(out.counts, float64(b.GetCumulativeCount()))
	}
	if n := len(out.les); n == 0 || !math.IsInf(out.les[n-1], 1) {
		out.les = append(out.les, math.Inf(1))
		out.counts = append(out.counts, out.count)
	}
	return out
}

// The server's latency histograms the bench reads (server/stage_metrics.go;
// in cluster mode the etcd transactions that commit its store too).
const (
	stageMetric   = "participantd_request_stage_duration_seconds"
	requestMetric = "participantd_request_duration_seconds"
	etcdTxnMetric = "participantd_cluster_etcd_txn_seconds"
)

// etcdTxnKey is the series of the etcd transactions that committed.
var etcdTxnKey = histKey{op: "etcd", stage: "txn"}

// histKey names one series: its operation and stage ("" for the whole
// request).
type histKey struct{ op, stage string }

// hist is one histogram series: cumulative counts by upper bound, in the
// order the exposition lists them (ascending, +Inf last), its sum and
// count.
type hist struct {
	les    []float64
	counts []float64
	sum    float64
	count  float64
}

// since returns h less an earlier scrape of it: the window's histogram.
func (h *hist) since(before *hist) *hist {
	d := &hist{les: h.les, counts: append([]float64(nil), h.counts...), sum: h.sum, count: h.count}
	if before == nil || len(before.counts) != len(h.counts) {
		return d
	}
	for i := range d.counts {
		d.counts[i] -= before.counts[i]
	}
	d.sum -= before.sum
	d.count -= before.count
	return d
}

// quantile is q of h, interpolated within its bucket as Prometheus's
// histogram_quantile does; in seconds, NaN when h is empty.
func (h *hist) quantile(q float64) float64 {
	if h.count <= 0 || len(h.counts) == 0 {
		return math.NaN()
	}
	rank := q * h.counts[len(h.counts)-1]
	lower, prev := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			if math.IsInf(h.les[i], 1) {
				return lower // past the last bound: its lower edge
			}
			if c == prev {
				return h.les[i]
			}
			return lower + (h.les[i]-lower)*(rank-prev)/(c-prev)
		}
		lower, prev = h.les[i], c
	}
	return lower
}

// stageFigure is one stage's latency over the measured window, in ms.
type stageFigure struct {
	Stage string  `json:"stage"`
	Count float64 `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
}

// stageOrder is the stages in the order a request passes them.
var stageOrder = []string{"worker", "turn", "decide", "oplog", "commit_wait", "commit", "prev", "publish", "wake", "write"}

// stageFigures returns op's stages over the window from before to after,
// then the whole request ("total"); nil when the server exports none.
func stageFigures(op string, before, after serverCounters) []stageFigure {
	var out []stageFigure
	add := func(name string, k histKey) {
		h := after.Hists[k]
		if h == nil {
			return
		}
		d := h.since(before.Hists[k])
		if d.count <= 0 {
			return
		}
		out = append(out, stageFigure{Stage: name, Count: d.count, Mean: d.sum / d.count * 1000,
			P50: d.quantile(0.5) * 1000, P90: d.quantile(0.9) * 1000, P99: d.quantile(0.99) * 1000})
	}
	for _, st := range stageOrder {
		add(st, histKey{op, st})
	}
	if len(out) == 0 {
		return nil
	}
	add("total", histKey{op, ""})
	// Cluster mode: the etcd round of one commit transaction, which the
	// commit stage waits for (per transaction, not per operation: its
	// mean does not add up with the others).
	add("etcd_txn", etcdTxnKey)
	return out
}
