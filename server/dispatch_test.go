package server_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// heldFlush is a server whose store holds one flush once armed, with two
// connections enrolled in conversation 1.
type heldFlush struct {
	h      *harness
	fs     *faultstore.Store
	a, b   *client
	ca, cb cred
}

// startHeldFlush starts a heldFlush; noPipeline is Config.NoPipeline.
func startHeldFlush(t *testing.T, noPipeline bool) *heldFlush {
	r := &heldFlush{}
	r.h = start(t, server.Config{NoPipeline: noPipeline, WrapStore: func(st store.DurableStore) store.DurableStore {
		r.fs = faultstore.New(st)
		return r.fs
	}})
	t.Cleanup(func() { r.fs.Release() })
	r.a, r.b = r.h.dial(), r.h.dial()
	r.ca, r.cb = r.a.enroll(1), r.b.enroll(1)
	return r
}

// tellHeld sends a tell of payload from c as cr and holds the flush
// that carries it until the store is released.
func (r *heldFlush) tellHeld(t *testing.T, c *client, cr cred, payload string) *wire.Tell {
	t.Helper()
	r.fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang)))
	m := tellOf(c, cr, payload)
	c.send(m)
	select {
	case <-r.fs.Hung():
	case <-time.After(waitFor):
		t.Fatal("the held tell's flush never started")
	}
	return m
}

// whileHeld checks, with the flush held, that the tell sent after the
// held one is decided on it, in flight (participantd_batches_pipelined_total
// at 1), or under noPipeline is not (at 0), and that c, which sent it, has
// no answer yet. It returns the count wanted from then on.
func (r *heldFlush) whileHeld(t *testing.T, noPipeline bool, c *client) float64 {
	t.Helper()
	want := 0.0
	if !noPipeline {
		want = 1
		eventually(t, "the second tell decided while the first is in its commit", func() bool {
			return r.h.metric(server.MetricBatchesPipelined) == 1
		})
	}
	// Pipelined or not, the second tell is answered only once the first
	// is durable; meanwhile a pipelined batch would have been decided and
	// counted.
	select {
	case m := <-c.in:
		t.Fatalf("NoPipeline %v: answered %#v with the first tell's flush held", noPipeline, m)
	case <-time.After(100 * time.Millisecond):
	}
	if got := r.h.metric(server.MetricBatchesPipelined); got != want {
		t.Errorf("NoPipeline %v: %s = %v with the first tell's flush held, want %v", noPipeline, server.MetricBatchesPipelined, got, want)
	}
	return want
}

func tellOf(c *client, cr cred, payload string) *wire.Tell {
	return &wire.Tell{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte(payload)}
}

// TestDispatch_ARequestReadDuringItsConnectionsCommitStartsAtOnce: a
// tell read while the connection's earlier tell on the same conversation
// is in its commit (the flush held) is started at once and decided on
// the first tell's batch in flight (participantd_batches_pipelined_total),
// not after the first is answered; neither is answered before the first
// is durable, and they are answered in the order read, with consecutive
// seqs, and delivered so. Under NoPipeline the second tell is started as
// well but waits for the turn, and nothing is pipelined.
//
// Before a connection's later requests started at once (a conversation's
// worker started them only once every request it had started was
// answered), the second tell was not started while the first's commit
// was held, and the counter stayed 0.
func TestDispatch_ARequestReadDuringItsConnectionsCommitStartsAtOnce(t *testing.T) {
	for _, noPipeline := range []bool{false, true} {
		r := startHeldFlush(t, noPipeline)
		a, b := r.a, r.b
		first := r.tellHeld(t, a, r.ca, "first")
		second := tellOf(a, r.ca, "second")
		a.send(second)
		r.whileHeld(t, noPipeline, a)
		r.fs.Release()

		var seqs []uint64
		for _, req := range []*wire.Tell{first, second} {
			told, ok := a.next().(*wire.Told)
			if !ok || told.ID != req.ID {
				t.Fatalf("NoPipeline %v: answered %#v, want told for request %d", noPipeline, told, req.ID)
			}
			seqs = append(seqs, told.Seq)
		}
		if seqs[1] != seqs[0]+1 {
			t.Errorf("NoPipeline %v: seqs %v, want consecutive", noPipeline, seqs)
		}
		for i, payload := range []string{"first", "second"} {
			if d := b.delivery(); d.Kind != wire.KindRecord || d.Seq != seqs[i] || string(d.Payload) != payload {
				t.Errorf("NoPipeline %v: delivery %d is %+v, want %q at seq %d", noPipeline, i, d, payload, seqs[i])
			}
		}
	}
}

// TestDispatch_AGroupWhoseBatchFailsAnswersInOrder: the first tell's
// flush is held and the second tell, read on the same connection, is
// started at once and decided on the first tell's batch in flight; the
// second batch's own flush then fails. The first tell is answered told,
// then the second in_doubt, in the order read. The second's row may have
// become durable with a later flush (a failed flush leaves its rows
// pending), so a retry with its token either commits it or replays it,
// at the seq after the first's, and replays it after; the other
// participant is delivered each tell once, in order.
func TestDispatch_AGroupWhoseBatchFailsAnswersInOrder(t *testing.T) {
	r := startHeldFlush(t, false)
	a, b := r.a, r.b
	first := r.tellHeld(t, a, r.ca, "first")
	r.fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Fail)))
	second := tellOf(a, r.ca, "second")
	a.send(second)
	r.whileHeld(t, false, a)
	r.fs.Release()

	told, ok := a.next().(*wire.Told)
	if !ok || told.ID != first.ID {
		t.Fatalf("answered %#v, want told for the first tell (request %d)", told, first.ID)
	}
	if e, ok := a.next().(*wire.Error); !ok || e.ID != second.ID || e.Code != wire.CodeInDoubt {
		t.Fatalf("answered %#v, want in_doubt for the second tell (request %d)", e, second.ID)
	}
	second.ID = a.id()
	again, ok := a.call(second).(*wire.Told)
	if !ok || again.Seq != told.Seq+1 {
		t.Fatalf("the second tell again = %#v, want it at seq %d", again, told.Seq+1)
	}
	second.ID = a.id()
	if replay, ok := a.call(second).(*wire.Told); !ok || replay.Replay == nil || replay.Seq != again.Seq {
		t.Fatalf("the second tell once more = %#v, want a replay of seq %d", replay, again.Seq)
	}
	third, ok := a.call(tellOf(a, r.ca, "third")).(*wire.Told)
	if !ok || third.Seq != again.Seq+1 {
		t.Fatalf("a third tell = %#v, want seq %d", third, again.Seq+1)
	}
	for i, payload := range []string{"first", "second", "third"} {
		if d := b.delivery(); d.Kind != wire.KindRecord || d.Seq != told.Seq+uint64(i) || string(d.Payload) != payload {
			t.Fatalf("delivery %d is %+v, want %q at seq %d", i, d, payload, told.Seq+uint64(i))
		}
	}
}
