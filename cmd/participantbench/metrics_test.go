package main

import (
	"math"
	"testing"
)

// TestStageFigures_QuantilesOfTheWindow reads two scrapes of a stage's
// histogram and interpolates the window's quantiles within their buckets,
// as Prometheus's histogram_quantile does.
func TestStageFigures_QuantilesOfTheWindow(t *testing.T) {
	scrape := func(lines map[string]float64) serverCounters {
		c := serverCounters{Hists: make(map[histKey]*hist)}
		for _, name := range []string{
			stageMetric + `_bucket{op="tell",stage="turn",le="0.001"}`,
			stageMetric + `_bucket{op="tell",stage="turn",le="0.002"}`,
			stageMetric + `_bucket{op="tell",stage="turn",le="+Inf"}`,
			stageMetric + `_sum{op="tell",stage="turn"}`,
			stageMetric + `_count{op="tell",stage="turn"}`,
			requestMetric + `_bucket{op="tell",le="0.001"}`,
			requestMetric + `_bucket{op="tell",le="+Inf"}`,
			requestMetric + `_sum{op="tell"}`,
			requestMetric + `_count{op="tell"}`,
		} {
			c.addHist(name, lines[name])
		}
		return c
	}
	before := scrape(map[string]float64{
		stageMetric + `_bucket{op="tell",stage="turn",le="0.001"}`: 10,
		stageMetric + `_bucket{op="tell",stage="turn",le="0.002"}`: 10,
		stageMetric + `_bucket{op="tell",stage="turn",le="+Inf"}`:  10,
		stageMetric + `_sum{op="tell",stage="turn"}`:                0.005,
		stageMetric + `_count{op="tell",stage="turn"}`:              10,
	})
	after := scrape(map[string]float64{
		// The window: 50 in (0, 1 ms], 50 in (1, 2 ms].
		stageMetric + `_bucket{op="tell",stage="turn",le="0.001"}`: 60,
		stageMetric + `_bucket{op="tell",stage="turn",le="0.002"}`: 110,
		stageMetric + `_bucket{op="tell",stage="turn",le="+Inf"}`:  110,
		stageMetric + `_sum{op="tell",stage="turn"}`:                0.155,
		stageMetric + `_count{op="tell",stage="turn"}`:              110,
		requestMetric + `_bucket{op="tell",le="0.001"}`:             0,
		requestMetric + `_bucket{op="tell",le="+Inf"}`:              100,
		requestMetric + `_sum{op="tell"}`:                           0.3,
		requestMetric + `_count{op="tell"}`:                         100,
	})
	figs := stageFigures("tell", before, after)
	if len(figs) != 2 || figs[0].Stage != "turn" || figs[1].Stage != "total" {
		t.Fatalf("stageFigures = %+v, want turn then total", figs)
	}
	turn := figs[0]
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	if turn.Count != 100 || !near(turn.Mean, 1.5) || !near(turn.P50, 1) || !near(turn.P90, 1.8) || !near(turn.P99, 1.98) {
		t.Errorf("turn = %+v, want count 100, mean 1.5, p50 1, p90 1.8, p99 1.98 ms", turn)
	}
	// Every request past the last finite bound: its lower edge.
	if total := figs[1]; total.Count != 100 || !near(total.P99, 1) {
		t.Errorf("total = %+v, want count 100 and p99 at the last bound, 1 ms", total)
	}
}
