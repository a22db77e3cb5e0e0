package server_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// TestMetrics_PipelinedBatchesAreCounted: a tell decided while the tell
// before it in its conversation is in flight (its flush held) counts in
// participantd_batches_pipelined_total, and both are answered once the
// flush goes on. Under NoPipeline (--pipeline-batches=false) the second
// tell waits for the turn instead, and none is counted.
func TestMetrics_PipelinedBatchesAreCounted(t *testing.T) {
	for _, noPipeline := range []bool{false, true} {
		var fs *faultstore.Store
		h := start(t, server.Config{NoPipeline: noPipeline, WrapStore: func(st store.DurableStore) store.DurableStore {
			fs = faultstore.New(st)
			return fs
		}})
		t.Cleanup(func() { fs.Release() })
		a, b := h.dial(), h.dial()
		ca, cb := a.enroll(1), b.enroll(1)
		if got := h.metric(server.MetricBatchesPipelined); got != 0 {
			t.Fatalf("%s = %v before any tell, want 0", server.MetricBatchesPipelined, got)
		}

		fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang)))
		a.send(&wire.Tell{ID: a.id(), Conversation: ca.conv, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("first")})
		select {
		case <-fs.Hung():
		case <-time.After(waitFor):
			t.Fatal("the first tell's flush never started")
		}
		b.send(&wire.Tell{ID: b.id(), Conversation: cb.conv, Participant: cb.p, Generation: cb.gen, Token: token(), Payload: []byte("second")})
		want := 0.0
		if !noPipeline {
			want = 1
			eventually(t, "the second tell decided while the first is in flight", func() bool {
				return h.metric(server.MetricBatchesPipelined) == 1
			})
		}
		// Pipelined or not, the second tell is answered only once the
		// first is durable; meanwhile a pipelined batch would have been
		// decided and counted.
		select {
		case m := <-b.in:
			t.Fatalf("NoPipeline %v: the second tell answered %#v with the first's flush held", noPipeline, m)
		case <-time.After(100 * time.Millisecond):
		}
		if got := h.metric(server.MetricBatchesPipelined); got != want {
			t.Errorf("NoPipeline %v: %s = %v with the first tell's flush held, want %v", noPipeline, server.MetricBatchesPipelined, got, want)
		}
		fs.Release()
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
