package server_test

import (
	"strings"
	"testing"

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
