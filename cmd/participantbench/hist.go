package main

import (
	"slices"
	"time"
)

// latencies collects one sample per counted answer. A run of the targets'
// size is a few hundred thousand samples, so keeping them all and sorting
// once gives exact percentiles at a cost of a few MiB.
type latencies []time.Duration

// summary is the percentiles of a set of latencies, in milliseconds.
type summary struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func (l latencies) summary() summary {
	if len(l) == 0 {
		return summary{}
	}
	s := slices.Clone(l)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q * float64(len(s)-1))
		return float64(s[i]) / float64(time.Millisecond)
	}
	return summary{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: at(1)}
}
