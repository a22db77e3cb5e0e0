package server_test

import (
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// TestMetrics_PipelinedBatchesAreCounted: a tell decided while the tell
// before it in its conversation is in flight (its flush held) counts in
// participantd_batches_pipelined_total, and both are answered once the
// flush goes on. Under NoPipeline (--pipeline-batches=false) the second
// tell waits for the turn instead, and none is counted.
func TestMetrics_PipelinedBatchesAreCounted(t *testing.T) {
	for _, noPipeline := range []bool{false, true} {
		r := startHeldFlush(t, noPipeline)
		h, a, b := r.h, r.a, r.b
		if got := h.metric(server.MetricBatchesPipelined); got != 0 {
			t.Fatalf("%s = %v before any tell, want 0", server.MetricBatchesPipelined, got)
		}
		r.tellHeld(t, a, r.ca, "first")
		b.send(tellOf(b, r.cb, "second"))
		want := r.whileHeld(t, noPipeline, b)
		r.fs.Release()
		for _, c := range []*client{a, b} {
			m := c.next()
			if _, ok := m.(*wire.Told); !ok {
				t.Fatalf("tell answered %#v, want told", m)
			}
		}
		if got := h.metric(server.MetricBatchesPipelined); got != want {
			t.Errorf("NoPipeline %v: %s = %v, want %v", noPipeline, server.MetricBatchesPipelined, got, want)
		}
	}
}
