package server_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// stageSeries is the series of op's stage in /metrics, with suffix
// (_count, _sum).
func stageSeries(op, stage, suffix string) string {
	return server.MetricStageDuration + suffix + `{op="` + op + `",stage="` + stage + `"}`
}

// allStages are the stage label's values, in the order a request passes
// them.
var allStages = []string{"worker", "turn", "decide", "oplog", "commit_wait", "commit", "prev", "publish", "wake", "write"}

// tellOnceTimed enrolls and tells once on h, and checks that the tell was
// counted once by every stage of passed and by no other, and that the
// stages, which follow each other, sum to no more than the whole request.
func tellOnceTimed(t *testing.T, h *harness, passed map[string]bool) {
	t.Helper()
	timedTell(t, h, passed, func(c *client, cr cred) { c.tell(cr, "timed") })
}

// timedTell enrolls on h and makes the tell of tell, and checks its
// stages as tellOnceTimed does.
func timedTell(t *testing.T, h *harness, passed map[string]bool, tell func(*client, cred)) {
	t.Helper()
	c := h.dial()
	cr := c.enroll(1)
	before := map[string]float64{}
	for _, st := range allStages {
		v, ok := h.lookup(stageSeries("tell", st, "_count"))
		if !ok {
			t.Fatalf("/metrics lacks %s before any tell", stageSeries("tell", st, "_count"))
		}
		before[st] = v
	}
	tell(c, cr)
	// The writer times an answer once it is written, which may be after
	// the peer read it: the pong, written after the tell's answer by the
	// same writer, is read only once that is done.
	c.ping()
	var sum float64
	for _, st := range allStages {
		n, _ := h.lookup(stageSeries("tell", st, "_count"))
		want := 0.0
		if passed[st] {
			want = 1
		}
		if got := n - before[st]; got != want {
			t.Errorf("stage %s counted %v tells, want %v", st, got, want)
		}
		s, _ := h.lookup(stageSeries("tell", st, "_sum"))
		sum += s
	}
	total, _ := h.lookup(server.MetricRequestDuration + `_count{op="tell"}`)
	totalSum, _ := h.lookup(server.MetricRequestDuration + `_sum{op="tell"}`)
	if total != 1 {
		t.Errorf("%s counted %v tells, want 1", server.MetricRequestDuration, total)
	}
	if sum > totalSum*(1+1e-9) {
		t.Errorf("the stages of the tell sum to %v s, more than the whole request's %v s", sum, totalSum)
	}
	// The enroll went through the same stages, under its own label.
	if n, _ := h.lookup(stageSeries("enroll", "commit", "_count")); n != 1 {
		t.Errorf("enroll's commit stage counted %v, want 1", n)
	}
}

// TestStageMetrics_ATellPassesEachStageOnce: on the log-first store a
// tell passes every stage once but barrier 1's own (oplog), which shares
// barrier 2's sync there.
func TestStageMetrics_ATellPassesEachStageOnce(t *testing.T) {
	h := start(t, server.Config{})
	tellOnceTimed(t, h, map[string]bool{"worker": true, "turn": true, "decide": true, "commit_wait": true,
		"commit": true, "publish": true, "wake": true, "write": true})
}

// TestStageMetrics_AClusterTellSharesOneCommitForBothBarriers: in cluster
// mode too a tell passes every stage once but barrier 1's own (oplog): the
// etcd store keeps a conversation's writes in order, so both barriers
// share one commit (it passed barrier 1 on its own before).
func TestStageMetrics_AClusterTellSharesOneCommitForBothBarriers(t *testing.T) {
	etcd := startEtcd(t)
	h := start(t, server.Config{Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: "a", Prefix: "/pd/", LeaseTTL: 2 * time.Second}})
	passed := map[string]bool{}
	for _, st := range allStages {
		passed[st] = st != "oplog" && st != "prev"
	}
	tellOnceTimed(t, h, passed)
}

// TestStageMetrics_ATellWhoseFlushFailsIsTimedToTheFailure: a tell whose
// barrier fails (answered in_doubt) is observed in the stages it passed,
// the failed commit included, and in the whole request, but not in
// publish: nothing was published.
func TestStageMetrics_ATellWhoseFlushFailsIsTimedToTheFailure(t *testing.T) {
	var fs *faultstore.Store
	h := start(t, server.Config{WrapStore: func(st store.DurableStore) store.DurableStore {
		fs = faultstore.New(st)
		return fs
	}})
	timedTell(t, h, map[string]bool{"worker": true, "turn": true, "decide": true, "commit_wait": true,
		"commit": true, "wake": true, "write": true}, func(c *client, cr cred) {
		fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Fail)))
		m := c.call(&wire.Tell{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte("x")})
		if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeInDoubt {
			t.Fatalf("tell with a failing flush answered %#v, want in_doubt", m)
		}
	})
}

// TestStageMetrics_APipelinedTellWaitsInPrev: of two tells of one
// conversation, the second decided while the first's flush is held,
// only the second passes prev, and its wait for the first is there, not
// in commit.
func TestStageMetrics_APipelinedTellWaitsInPrev(t *testing.T) {
	var fs *faultstore.Store
	h := start(t, server.Config{WrapStore: func(st store.DurableStore) store.DurableStore {
		fs = faultstore.New(st)
		return fs
	}})
	t.Cleanup(func() { fs.Release() })
	a, b := h.dial(), h.dial()
	ca, cb := a.enroll(1), b.enroll(1)
	sums := func(stage string) float64 {
		v, ok := h.lookup(stageSeries("tell", stage, "_sum"))
		if !ok {
			t.Fatalf("/metrics lacks %s", stageSeries("tell", stage, "_sum"))
		}
		return v
	}
	commitBefore := sums("commit")

	fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang)))
	a.send(&wire.Tell{ID: a.id(), Conversation: ca.conv, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("first")})
	select {
	case <-fs.Hung():
	case <-time.After(waitFor):
		t.Fatal("the first tell's flush never started")
	}
	hung := time.Now()
	b.send(&wire.Tell{ID: b.id(), Conversation: cb.conv, Participant: cb.p, Generation: cb.gen, Token: token(), Payload: []byte("second")})
	eventually(t, "the second tell decided while the first is in flight", func() bool {
		return h.metric(server.MetricBatchesPipelined) == 1
	})
	pipelined := time.Now()
	select {
	case m := <-b.in:
		t.Fatalf("the second tell answered %#v with the first's flush held", m)
	case <-time.After(100 * time.Millisecond):
	}
	fs.Release()
	held, waited := time.Since(hung), time.Since(pipelined)
	for _, c := range []*client{a, b} {
		m := c.next()
		if _, ok := m.(*wire.Told); !ok {
			t.Fatalf("tell answered %#v, want told", m)
		}
		c.ping() // its answer written, and so timed
	}
	if n, _ := h.lookup(stageSeries("tell", "prev", "_count")); n != 1 {
		t.Errorf("stage prev counted %v tells, want 1: the second", n)
	}
	if p := sums("prev"); p < waited.Seconds()/2 {
		t.Errorf("stage prev holds %v s, want the second tell's wait for the held first, about %v", p, waited)
	}
	// The first tell's commit holds the held flush; the second's, not
	// its wait for the first.
	if c := sums("commit") - commitBefore; c > (held + waited/2).Seconds() {
		t.Errorf("stage commit holds %v s of the two tells, want about the %v the first's flush was held, once", c, held)
	}
}
