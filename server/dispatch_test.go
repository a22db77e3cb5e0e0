package server_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

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
		var fs *faultstore.Store
		h := start(t, server.Config{NoPipeline: noPipeline, WrapStore: func(st store.DurableStore) store.DurableStore {
			fs = faultstore.New(st)
			return fs
		}})
		t.Cleanup(func() { fs.Release() })
		a, b := h.dial(), h.dial()
		ca := a.enroll(1)
		b.enroll(1)

		fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang)))
		first := &wire.Tell{ID: a.id(), Conversation: ca.conv, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("first")}
		second := &wire.Tell{ID: a.id(), Conversation: ca.conv, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("second")}
		a.send(first)
		select {
		case <-fs.Hung():
		case <-time.After(waitFor):
			t.Fatal("the first tell's flush never started")
		}
		a.send(second)
		want := 0.0
		if !noPipeline {
			want = 1
			eventually(t, "the second tell decided while the first is in its commit", func() bool {
				return h.metric(server.MetricBatchesPipelined) == 1
			})
		}
		select {
		case m := <-a.in:
			t.Fatalf("NoPipeline %v: answered %#v with the first tell's flush held", noPipeline, m)
		case <-time.After(100 * time.Millisecond):
		}
		if got := h.metric(server.MetricBatchesPipelined); got != want {
			t.Errorf("NoPipeline %v: %s = %v with the first tell's flush held, want %v", noPipeline, server.MetricBatchesPipelined, got, want)
		}
		fs.Release()

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
