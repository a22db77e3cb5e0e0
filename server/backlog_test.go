package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// A member that never acknowledges fills its conversation's backlog: past
// max-backlog-records a tell is answered backlog_full with the limit, the
// refusal is counted in /metrics, an ack still commits, and the refused
// tell retried with its token then commits.
func TestBacklog_FullConversationRefusesTellsUntilAcked(t *testing.T) {
	const limit = 10
	h := start(t, server.Config{MaxBacklogRecords: limit})
	deaf, sender := h.dial(), h.dial()
	rx := deaf.enroll(1)
	tx := sender.enroll(1)
	var (
		last    uint64
		refused *wire.Tell
	)
	for i := 0; refused == nil; i++ {
		if i > 10*limit {
			t.Fatalf("%d tells committed to a member that never acks, past a limit of %d", i, limit)
		}
		req := &wire.Tell{ID: sender.id(), Conversation: 1, Participant: tx.p, Generation: tx.gen, Token: token()}
		switch a := sender.call(req).(type) {
		case *wire.Told:
			last = a.Seq
		case *wire.Error:
			if a.Code != wire.CodeBacklogFull || a.Limit == nil || *a.Limit != limit {
				t.Fatalf("tell past the backlog limit answered %#v, want backlog_full with limit %d", a, limit)
			}
			refused = req
		default:
			t.Fatalf("tell answered %#v", a)
		}
	}
	if _, body := h.get("/metrics"); !strings.Contains(body, server.MetricBacklogRefusals+`{limit="conversation"} 1`) {
		t.Errorf("/metrics does not count the refusal:\n%s", grepLines(body, server.MetricBacklogRefusals))
	}
	if a, ok := deaf.call(&wire.Ack{ID: deaf.id(), Conversation: 1, Participant: rx.p, Generation: rx.gen, Through: last}).(*wire.Acked); !ok {
		t.Fatalf("ack at a full backlog answered %#v, want acked", a)
	}
	refused.ID = sender.id()
	if a, ok := sender.call(refused).(*wire.Told); !ok || a.Replay != nil || a.Seq != last+1 {
		t.Fatalf("refused tell retried after the ack answered %#v, want told seq %d", a, last+1)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestZeroByteTellsToADeafMemberKeepTheHeapBounded pipelines 300,000
// zero-byte tells to a member that never reads nor acknowledges: they cost
// no payload, only each retained record's metadata, so without a bound on
// records the heap grows with every tell. With max-backlog-records the
// server retains that many, refuses the rest backlog_full, and the heap
// stays at the limit's worth.
func TestZeroByteTellsToADeafMemberKeepTheHeapBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 300,000 tells")
	}
	const (
		limit  = 10_000
		n      = 300_000
		window = 256
	)
	h := start(t, server.Config{MaxBacklogRecords: limit, WriteProgressTimeout: time.Minute})
	deaf := h.dialQuiet(4096)
	deaf.enroll(1)
	sender := h.dial()
	cr := sender.enroll(1)
	before := heapAlloc()
	committed, refused := 0, 0
	for sent := 0; sent < n; sent += window {
		w := min(window, n-sent)
		for range w {
			sender.send(&wire.Tell{ID: sender.id(), Conversation: 1, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte{}})
		}
		for range w {
			switch a := sender.next().(type) {
			case *wire.Told:
				committed++
			case *wire.Error:
				if a.Code != wire.CodeBacklogFull {
					t.Fatalf("tell answered %v: %s", a.Code, a.Detail)
				}
				refused++
			default:
				t.Fatalf("tell answered %#v", a)
			}
		}
	}
	after := heapAlloc()
	records := h.metric(server.MetricBacklogRecords)
	t.Logf("%d zero-byte tells: %d committed, %d refused; %v records retained; heap grew %.1f MiB",
		n, committed, refused, records, (float64(after)-float64(before))/(1<<20))
	if records > limit {
		t.Errorf("%s = %v, want at most max-backlog-records %d", server.MetricBacklogRecords, records, limit)
	}
	// The retained records (about 1 MiB), the deaf connection's outbound
	// queue (4 MiB), the log-first store's uncheckpointed batches and
	// value cache, and slack; unbounded, 300,000 records cost some 35 MiB.
	const bound = 20 << 20
	if after > before && after-before > bound {
		t.Errorf("%d zero-byte tells to a deaf member grew the heap by %.1f MiB, want < %d MiB",
			n, float64(after-before)/(1<<20), bound>>20)
	}
}
