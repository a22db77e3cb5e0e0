package server_test

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
)

// lookup returns metric name (with its labels, as /metrics writes them:
// `name{label="v"}`) and whether /metrics has it.
func (h *harness) lookup(name string) (float64, bool) {
	h.t.Helper()
	_, body := h.get("/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				h.t.Fatalf("metric %s = %q: %v", name, v, err)
			}
			return f, true
		}
	}
	return 0, false
}

// lifecycleConfig checkpoints every few milliseconds, any conversation a
// row behind, and compacts history settled a millisecond ago.
func lifecycleConfig() server.Config {
	return server.Config{CheckpointInterval: 10 * time.Millisecond, CheckpointRows: 1, Retain: time.Millisecond}
}

// TestLifecycleMetrics_CheckpointsAndCompactionMove serves a conversation
// whose only member tells (so every record is settled at once) and one
// whose records a member never acknowledges: the checkpoint and compaction
// counters, their pass histograms and last-success gauges move, and the
// second conversation is counted pinned.
func TestLifecycleMetrics_CheckpointsAndCompactionMove(t *testing.T) {
	h := start(t, lifecycleConfig())
	for _, name := range []string{server.MetricCheckpointsWritten, server.MetricCompactedOplogBytes, server.MetricReceiptsWritten} {
		if _, ok := h.lookup(name); !ok {
			t.Errorf("/metrics lacks %s before any pass", name)
		}
	}
	a := h.dial()
	ca := a.enroll(1)
	for i := range 20 {
		a.tell(ca, "settled "+strconv.Itoa(i))
	}
	c, d := h.dial(), h.dial()
	cc := c.enroll(2)
	d.enroll(2)
	c.tell(cc, "never acknowledged")

	began := float64(time.Now().Add(-time.Second).Unix())
	for _, m := range []string{
		server.MetricCheckpointsWritten,
		server.MetricCheckpointBytes,
		server.MetricCheckpointPasses + `{outcome="ok"}`,
		server.MetricCheckpointPassDuration + "_count",
		server.MetricCompactionPasses + `{outcome="ok"}`,
		server.MetricCompactionPassDuration + "_count",
		server.MetricCompactedRows + `{stream="oplog"}`,
		server.MetricCompactedRows + `{stream="outbox"}`,
		server.MetricCompactedOplogBytes,
		server.MetricReceiptsWritten,
	} {
		eventually(t, m+" > 0", func() bool { v, _ := h.lookup(m); return v > 0 })
	}
	for _, m := range []string{server.MetricCheckpointLastSuccess, server.MetricCompactionLastSuccess} {
		eventually(t, m+" is a recent unix time", func() bool { v, _ := h.lookup(m); return v >= began })
	}
	eventually(t, server.MetricConversationsPinned+" = 1", func() bool {
		v, ok := h.lookup(server.MetricConversationsPinned)
		return ok && v == 1
	})
	if n, _ := h.lookup(server.MetricCheckpointPasses + `{outcome="error"}`); n != 0 {
		t.Errorf("%s{outcome=\"error\"} = %v with a healthy store, want 0", server.MetricCheckpointPasses, n)
	}
}

// limitedStore refuses checkpoints as too large while tooLarge is set, as
// etcd refuses a value past its request size.
type limitedStore struct {
	*faultstore.Store
	tooLarge atomic.Bool
}

func (l *limitedStore) PutBytes(values []store.Bytes) error {
	if l.tooLarge.Load() {
		for _, v := range values {
			if strings.HasPrefix(v.Key, checkpoint.KeyPrefix) {
				return store.ErrTooLarge
			}
		}
	}
	return l.Store.PutBytes(values)
}

// TestLifecycleMetrics_SkipsAndFailures makes checkpoints too large for the
// store, then makes the store fail their writes, then leaves an unreadable
// checkpoint in place: each shows in its skip reason or in the failed
// passes and the conversation's failed step.
func TestLifecycleMetrics_SkipsAndFailures(t *testing.T) {
	var ls *limitedStore
	cfg := lifecycleConfig()
	cfg.WrapStore = func(st store.DurableStore) store.DurableStore {
		ls = &limitedStore{Store: faultstore.New(st)}
		ls.tooLarge.Store(true)
		return ls
	}
	h := start(t, cfg)
	a := h.dial()
	ca := a.enroll(1)
	a.tell(ca, "x")
	tooLarge := server.MetricCheckpointsSkipped + `{reason="too_large"}`
	eventually(t, tooLarge+" > 0", func() bool { v, _ := h.lookup(tooLarge); return v > 0 })
	if v, _ := h.lookup(server.MetricCheckpointsWritten); v != 0 {
		t.Errorf("%s = %v while every checkpoint is too large, want 0", server.MetricCheckpointsWritten, v)
	}

	ls.tooLarge.Store(false)
	ls.SetRules(faultstore.OnKind(faultstore.OpPutBytes, faultstore.Fail))
	a.tell(ca, "y")
	failed := server.MetricCheckpointPasses + `{outcome="error"}`
	eventually(t, failed+" > 0", func() bool { v, _ := h.lookup(failed); return v > 0 })
	convFailed := server.MetricPassConversationFails + `{step="checkpoint"}`
	if v, _ := h.lookup(convFailed); v == 0 {
		t.Errorf("%s = 0 after a pass failed the conversation's checkpoint", convFailed)
	}
	ls.SetRules()

	cb := a.enroll(3)
	a.tell(cb, "z")
	unreadable := server.MetricCheckpointsSkipped + `{reason="unreadable"}`
	eventually(t, unreadable+" > 0", func() bool {
		// Rewritten at every poll, in case a pass replaced it meanwhile.
		if err := ls.PutBytes([]store.Bytes{{Key: checkpoint.Key(3), Value: []byte("garbage")}}); err != nil {
			t.Fatalf("PutBytes: %v", err)
		}
		v, _ := h.lookup(unreadable)
		return v > 0
	})
}
