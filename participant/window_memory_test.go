package participant

import (
	"bytes"
	"context"
	"testing"

	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
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

// TestAStartHoldsAtMostAWindowOfADeafRecipientsPayloads: a start loads a
// conversation whose recipient never read many times its window, from a
// checkpoint and the rows after it: what the loaded state holds of the
// payloads must stay within the window (Options.BacklogWindowBytes), the
// rest counted as evicted to be read back from the oplog, not every
// payload retained read into memory before the first eviction. The
// recipient then gets every record byte for byte.
func TestAStartHoldsAtMostAWindowOfADeafRecipientsPayloads(t *testing.T) {
	const (
		window = 256 << 10
		size   = 64 << 10
	)
	ctx := context.Background()
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, BacklogWindowBytes: window}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	deaf, sender := svc.Connect(nil), svc.Connect(nil)
	rx := mustEnroll(t, deaf, 1, 1)
	tx := mustEnroll(t, sender, 1, 2)
	want := map[Seq][]byte{}
	tell := func(i int) {
		p := payloadOf(i, size)
		told, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: tx.Participant, Generation: tx.Generation, Token: benchToken(7, uint64(i)), Payload: p})
		must(t, err)
		want[told.Seq] = p
	}
	for i := range 24 {
		tell(i)
	}
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	for i := 24; i < 40; i++ {
		tell(i)
	}
	r, err := reconcile(ctx, mem, 1, svc.pages)
	must(t, err)
	if r.State.PayloadBytes > window {
		t.Errorf("a start loaded %d payload bytes of the deaf recipient's %d, want at most its window, %d",
			r.State.PayloadBytes, r.State.PayloadBytes+r.State.EvictedBytes, window)
	}
	if got := r.State.PayloadBytes + r.State.EvictedBytes; got != 40*size {
		t.Errorf("loaded state accounts for %d payload bytes, in memory and evicted, want %d", got, 40*size)
	}
	must(t, svc.Close())

	svc = openService(t, mem)
	c := svc.Connect(nil)
	_, err = c.Attach(ctx, Attach{Conversation: 1, Participant: rx.Participant, Generation: rx.Generation, Secret: rx.Secret, Token: token(0x41)})
	must(t, err)
	var got int
	for _, d := range drainNext(c, 1) {
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
