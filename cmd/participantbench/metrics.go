package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
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
	c := serverCounters{Hists: make(map[histKey]*hist)}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		name, val := line[:i], line[i+1:]
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		if strings.HasPrefix(name, stageMetric) || strings.HasPrefix(name, requestMetric) || strings.HasPrefix(name, etcdTxnMetric) {
			c.addHist(name, v)
			continue
		}
		switch name {
		case "participantd_store_commits_total":
			c.Commits = v
		case "participantd_store_flushes_total":
			c.Flushes = v
		case "participantd_store_committed_ops_total":
			c.Committed = v
		case "process_cpu_seconds_total":
			c.CPUSeconds = v
		}
	}
	return c, sc.Err()
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

// addHist adds one sample line of a latency histogram to c.
func (c *serverCounters) addHist(name string, v float64) {
	base, labels, ok := strings.Cut(name, "{")
	if !ok {
		return
	}
	var k histKey
	var le string
	for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
		key, val, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		val = strings.Trim(val, `"`)
		switch key {
		case "op":
			k.op = val
		case "stage":
			k.stage = val
		case "le":
			le = val
		case "outcome":
			if val != "ok" {
				return
			}
		}
	}
	switch {
	case strings.HasPrefix(base, requestMetric):
		k.stage = ""
	case strings.HasPrefix(base, etcdTxnMetric):
		k = etcdTxnKey
	}
	h := c.Hists[k]
	if h == nil {
		h = &hist{}
		c.Hists[k] = h
	}
	switch {
	case strings.HasSuffix(base, "_bucket"):
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return
		}
		h.les = append(h.les, bound)
		h.counts = append(h.counts, v)
	case strings.HasSuffix(base, "_sum"):
		h.sum = v
	case strings.HasSuffix(base, "_count"):
		h.count = v
	}
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
var stageOrder = []string{"worker", "turn", "decide", "oplog", "commit_wait", "commit", "publish", "wake", "write"}

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
	// oplog and commit stages each wait for (per transaction, not per
	// operation: its mean does not add up with the others).
	add("etcd_txn", etcdTxnKey)
	return out
}
