package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// exposition is every series of the histograms the bench reads that
// TestStageFigures_QuantilesOfTheWindow exports, in the exposition's
// order within each family.
var exposition = []string{
	"process_cpu_seconds_total",
	stageMetric + `_bucket{op="tell",stage="turn",le="0.001"}`,
	stageMetric + `_bucket{op="tell",stage="turn",le="0.002"}`,
	stageMetric + `_bucket{op="tell",stage="turn",le="+Inf"}`,
	stageMetric + `_sum{op="tell",stage="turn"}`,
	stageMetric + `_count{op="tell",stage="turn"}`,
	requestMetric + `_bucket{op="tell",le="0.001"}`,
	requestMetric + `_bucket{op="tell",le="+Inf"}`,
	requestMetric + `_sum{op="tell"}`,
	requestMetric + `_count{op="tell"}`,
	etcdTxnMetric + `_bucket{outcome="ok",le="0.01"}`,
	etcdTxnMetric + `_bucket{outcome="ok",le="+Inf"}`,
	etcdTxnMetric + `_sum{outcome="ok"}`,
	etcdTxnMetric + `_count{outcome="ok"}`,
	etcdTxnMetric + `_bucket{outcome="refused",le="0.01"}`,
	etcdTxnMetric + `_bucket{outcome="refused",le="+Inf"}`,
	etcdTxnMetric + `_sum{outcome="refused"}`,
	etcdTxnMetric + `_count{outcome="refused"}`,
}

// TestStageFigures_QuantilesOfTheWindow reads two scrapes of a stage's
// histogram and interpolates the window's quantiles within their buckets,
// as Prometheus's histogram_quantile does.
func TestStageFigures_QuantilesOfTheWindow(t *testing.T) {
	// scrape is what a server exports with the sample values of lines
	// (the rest of each series as before), read as a scrape reads it.
	scrape := func(lines map[string]float64) serverCounters {
		t.Helper()
		var b strings.Builder
		for _, fam := range []struct{ name, typ string }{
			{"process_cpu_seconds_total", "counter"},
			{stageMetric, "histogram"},
			{requestMetric, "histogram"},
			{etcdTxnMetric, "histogram"},
		} {
			fmt.Fprintf(&b, "# TYPE %s %s\n", fam.name, fam.typ)
			for _, series := range exposition {
				if strings.HasPrefix(series, fam.name) {
					fmt.Fprintf(&b, "%s %v\n", series, lines[series])
				}
			}
		}
		c, err := parseCounters(strings.NewReader(b.String()))
		if err != nil {
			t.Fatalf("parseCounters:\n%s\n%v", b.String(), err)
		}
		return c
	}
	before := scrape(map[string]float64{
		stageMetric + `_bucket{op="tell",stage="turn",le="0.001"}`: 10,
		stageMetric + `_bucket{op="tell",stage="turn",le="0.002"}`: 10,
		stageMetric + `_bucket{op="tell",stage="turn",le="+Inf"}`:  10,
		stageMetric + `_sum{op="tell",stage="turn"}`:               0.005,
		stageMetric + `_count{op="tell",stage="turn"}`:             10,
	})
	after := scrape(map[string]float64{
		"process_cpu_seconds_total": 2.5,
		// The window: 50 in (0, 1 ms], 50 in (1, 2 ms].
		stageMetric + `_bucket{op="tell",stage="turn",le="0.001"}`: 60,
		stageMetric + `_bucket{op="tell",stage="turn",le="0.002"}`: 110,
		stageMetric + `_bucket{op="tell",stage="turn",le="+Inf"}`:  110,
		stageMetric + `_sum{op="tell",stage="turn"}`:               0.155,
		stageMetric + `_count{op="tell",stage="turn"}`:             110,
		requestMetric + `_bucket{op="tell",le="0.001"}`:            0,
		requestMetric + `_bucket{op="tell",le="+Inf"}`:             100,
		requestMetric + `_sum{op="tell"}`:                          0.3,
		requestMetric + `_count{op="tell"}`:                        100,
		// Cluster mode: ten committed etcd transactions of 5 ms; the
		// refused ones are not the commit round.
		etcdTxnMetric + `_bucket{outcome="ok",le="0.01"}`:      10,
		etcdTxnMetric + `_bucket{outcome="ok",le="+Inf"}`:      10,
		etcdTxnMetric + `_sum{outcome="ok"}`:                   0.05,
		etcdTxnMetric + `_count{outcome="ok"}`:                 10,
		etcdTxnMetric + `_bucket{outcome="refused",le="0.01"}`: 0,
		etcdTxnMetric + `_bucket{outcome="refused",le="+Inf"}`: 7,
		etcdTxnMetric + `_count{outcome="refused"}`:            7,
	})
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if after.CPUSeconds != 2.5 {
		t.Errorf("CPUSeconds = %v, want the counter's 2.5", after.CPUSeconds)
	}
	figs := stageFigures("tell", before, after)
	if len(figs) != 3 || figs[0].Stage != "turn" || figs[1].Stage != "total" || figs[2].Stage != "etcd_txn" {
		t.Fatalf("stageFigures = %+v, want turn, total, etcd_txn", figs)
	}
	if txn := figs[2]; txn.Count != 10 || !near(txn.Mean, 5) {
		t.Errorf("etcd_txn = %+v, want the 10 committed transactions, mean 5 ms", txn)
	}
	turn := figs[0]
	if turn.Count != 100 || !near(turn.Mean, 1.5) || !near(turn.P50, 1) || !near(turn.P90, 1.8) || !near(turn.P99, 1.98) {
		t.Errorf("turn = %+v, want count 100, mean 1.5, p50 1, p90 1.8, p99 1.98 ms", turn)
	}
	// Every request past the last finite bound: its lower edge.
	if total := figs[1]; total.Count != 100 || !near(total.P99, 1) {
		t.Errorf("total = %+v, want count 100 and p99 at the last bound, 1 ms", total)
	}
}
