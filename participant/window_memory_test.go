package participant

import (
	"bytes"
	"testing"

	"github.com/participantd/participantd/outbox"
)

// TestADeafRecipientHoldsAtMostItsWindowInMemory tells a recipient that
// never reads or acknowledges eight times the service's backlog budget:
// what memory holds of its payloads must stay within the conversation's
// window (Options.BacklogWindowBytes), after every tell and whatever the
// volume, not grow to the service's budget; everything else is counted as
// evicted, to be read back from the oplog. It reads the service's own
// account (Backlog), not the heap or the clock. The recipient then catches
// up and gets every record byte for byte.
func TestADeafRecipientHoldsAtMostItsWindowInMemory(t *testing.T) {
	const (
		budget = 4 << 20
		size   = 64 << 10
		total  = 8 * budget
	)
	e := newBacklogEnv(t, budget)
	window := e.svc.opts.BacklogWindowBytes
	if window <= 0 || window >= budget {
		t.Fatalf("BacklogWindowBytes = %d with a budget of %d: want a window below the budget", window, budget)
	}
	want := make(map[Seq][]byte)
	for i := range total / size {
		p := payloadOf(i, size)
		want[e.tell(t, p)] = p
		if bl := e.svc.Backlog(); bl.MemoryBytes > window {
			t.Fatalf("after %d KiB told to a deaf recipient the backlog holds %d bytes in memory, want <= its window, %d",
				(i+1)*size>>10, bl.MemoryBytes, window)
		}
	}
	bl := e.svc.Backlog()
	if got := bl.MemoryBytes + bl.EvictedBytes; got != total {
		t.Errorf("Backlog() memory+evicted = %d bytes, want %d", got, total)
	}
	var got int
	for _, d := range drainNext(e.recipient, 1) {
		if d.Kind != outbox.KindRecord {
			continue
		}
		got++
		if !bytes.Equal(want[d.Seq], d.Payload) {
			t.Fatalf("record %v: payload of %d bytes differs from the %d told", d.Seq, len(d.Payload), len(want[d.Seq]))
		}
	}
	if got != len(want) {
		t.Fatalf("the recipient received %d records, want %d", got, len(want))
	}
}
