package e2e_test

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/participantd/participantd/wire"
)

// TestHeapGoal_TheDaemonSetsAMemoryLimitThatFollowsItsLiveHeap starts the
// binary with the default --heap-goal (median) and with runtime, tells
// 8 MiB into a conversation (collections happen), and reads the memory
// limit the runtime reports (go_gc_gomemlimit_bytes): a finite limit set
// by the follower, no limit with runtime's own goal.
func TestHeapGoal_TheDaemonSetsAMemoryLimitThatFollowsItsLiveHeap(t *testing.T) {
	bin := buildBinary(t)
	for _, c := range []struct {
		goal    string
		limited bool
	}{{"median", true}, {"runtime", false}} {
		t.Run(c.goal, func(t *testing.T) {
			p := startProc(t, bin, t.TempDir(), "PARTICIPANTD_HEAP_GOAL="+c.goal)
			cl := dial(t, p.addr)
			cr := cl.enroll(1)
			payload := bytes.Repeat([]byte{0xab}, 64<<10)
			cl.pipeline(128, 16, func(_ int, id uint64) wire.Message {
				return &wire.Tell{ID: id, Conversation: 1, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: payload}
			}, func(m wire.Message) {
				if _, ok := m.(*wire.Told); !ok {
					t.Fatalf("tell answered %#v", m)
				}
			})
			// The follower sets the limit just after a collection, on
			// its own goroutine: the last tells' collection may be a
			// moment ahead of it.
			limit := p.metric(t, "go_gc_gomemlimit_bytes")
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for deadline := time.Now().Add(10 * time.Second); c.limited && limit >= math.MaxInt64/2 && time.Now().Before(deadline); <-tick.C {
				limit = p.metric(t, "go_gc_gomemlimit_bytes")
			}
			switch {
			case limit < 0:
				t.Fatal("no go_gc_gomemlimit_bytes in /metrics")
			case c.limited && limit >= math.MaxInt64/2:
				t.Fatalf("--heap-goal %s: no memory limit after 8 MiB told", c.goal)
			case c.limited && limit < 4<<20:
				t.Fatalf("--heap-goal %s: a memory limit of %v bytes", c.goal, limit)
			case !c.limited && limit < math.MaxInt64/2:
				t.Fatalf("--heap-goal %s: a memory limit of %v bytes; want none", c.goal, limit)
			}
		})
	}
}
