package participant

import (
	"context"
	"errors"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// TestEachBarrierPhaseFailsWithoutPublishing fails each of the four barrier
// phases of a tell in turn. The failing tell gets no answer (in_doubt),
// and the other participant gets no inbox entry and no wake. Once the
// store recovers, the retry with the same token learns the outcome, the
// other participant is woken exactly once, and is offered the record at
// the committed seq exactly once.
func TestEachBarrierPhaseFailsWithoutPublishing(t *testing.T) {
	phases := []struct {
		name      string
		rule      faultstore.Rule
		uncertain bool
	}{
		{"oplog append", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("oplog/")), false},
		{"oplog flush", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("oplog/")), false},
		{"outbox append", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(outbox.StreamPrefix)), false},
		{"outbox flush", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(outbox.StreamPrefix)), false},
		{"oplog append uncertain", faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("oplog/")), true},
		{"outbox flush uncertain", faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(outbox.StreamPrefix)), true},
	}
	for _, order := range []string{"one sync", "two syncs"} {
		for _, ph := range phases {
			t.Run(order+"/"+ph.name, func(t *testing.T) {
				eachBarrierPhase(t, ph.name, ph.rule, ph.uncertain, order == "two syncs")
			})
		}
	}
}

// eachBarrierPhase is one phase of TestEachBarrierPhaseFailsWithoutPublishing,
// over a store that keeps its writes' order (the barriers share a sync) or,
// unordered, one that does not (a flush per barrier).
func eachBarrierPhase(t *testing.T, name string, rule faultstore.Rule, uncertain, unordered bool) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	fs.SetUnordered(unordered)
	sw := faultstore.NewSwitch(rule)
	fs.SetRules(sw)
	svc := openService(t, fs)
	const conv = 5
	sender := svc.Connect(nil)
	a, err := sender.Enroll(ctx, Enroll{Conversation: conv, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	wakes := &wakeCounter{}
	receiver := svc.Connect(wakes.wake)
	b, err := receiver.Enroll(ctx, Enroll{Conversation: conv, Token: token(2)})
	if err != nil {
		t.Fatal(err)
	}
	if wakes.count() != 0 || receiver.HasReady() {
		t.Fatalf("the receiver was woken before any record for it")
	}
	tell := Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: token(3), Payload: []byte("x")}

	sw.Set(true)
	if _, err := sender.Tell(ctx, tell); !errors.Is(err, ErrInDoubt) {
		t.Fatalf("Tell with a failing %s = %v, want in_doubt", name, err)
	}
	// The failed commit drops the conversation and a background
	// reload starts. While the store still fails, that reload cannot
	// complete, so nothing is published; an uncertain failure that
	// did make everything durable may be reconciled and published.
	svc.waitReloads()
	if !uncertain {
		if wakes.count() != 0 || receiver.HasReady() {
			t.Fatalf("a failed %s published: wakes=%d ready=%v", name, wakes.count(), receiver.HasReady())
		}
		if ds := drainNext(receiver, conv); len(ds) != 0 {
			t.Fatalf("a failed %s offered %+v", name, ds)
		}
	}

	sw.Set(false)
	told, err := sender.Tell(ctx, tell)
	svc.waitReloads()
	if err != nil {
		t.Fatalf("retry after a failed %s: %v", name, err)
	}
	if wakes.count() != 1 {
		t.Fatalf("receiver woken %d times after the retry, want exactly 1", wakes.count())
	}
	ds := drainNext(receiver, conv)
	if len(ds) != 1 || ds[0].Seq != told.Seq || ds[0].Kind != outbox.KindRecord || string(ds[0].Payload) != "x" || ds[0].Recipient != b.Participant {
		t.Fatalf("receiver offered %+v, want the record once at seq %v", ds, told.Seq)
	}
	if told.Seq != 3 {
		t.Fatalf("told seq = %v, want 3: no seq is lost or doubled by the failure", told.Seq)
	}
	// The outcome is final: the same token now replays.
	again, err := sender.Tell(ctx, tell)
	if err != nil || again.Replay != ReplayCommitted || again.Seq != told.Seq {
		t.Fatalf("second retry = %+v, %v; want a committed replay of seq %v", again, err, told.Seq)
	}
	if n := oplogLen(t, fs, conv); n != 4 {
		t.Fatalf("oplog rows = %d, want 4: genesis, two enrollments, one tell", n)
	}
}

// TestAFailedBindingEndIsRestoredAndRecordedOnce makes the end of a
// connection's binding fail, then ends it again: exactly one ending is
// recorded for the binding.
func TestAFailedBindingEndIsRestoredAndRecordedOnce(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	sw := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("oplog/")))
	fs.SetRules(sw)
	svc := openService(t, fs)
	a := svc.Connect(nil)
	if _, err := a.Enroll(ctx, Enroll{Conversation: 9, Token: token(1)}); err != nil {
		t.Fatal(err)
	}
	b := svc.Connect(nil)
	bp, err := b.Enroll(ctx, Enroll{Conversation: 9, Token: token(2)})
	if err != nil {
		t.Fatal(err)
	}
	sw.Set(true)
	if err := b.End(ctx, oplog.CauseConnectionLost); !errors.Is(err, ErrInDoubt) {
		t.Fatalf("End with a failing oplog = %v, want in_doubt", err)
	}
	sw.Set(false)
	// The conversation reloads on the next touch; b's connection has ended,
	// so the reload records the binding's end as connection_lost, once.
	if _, err := a.Tell(ctx, Tell{Conversation: 9, Participant: 0, Generation: 1, Token: token(3)}); err != nil {
		t.Fatal(err)
	}
	ends := 0
	for _, row := range decodeOutbox(t, rawOutbox(t, fs, 9)) {
		for _, rec := range row.Records {
			if rec.Participant == bp.Participant && (rec.Kind == outbox.KindDied || rec.Kind == outbox.KindDetached) {
				ends++
				if rec.Cause != oplog.CauseConnectionLost {
					t.Fatalf("ending cause = %v, want connection_lost", rec.Cause)
				}
			}
		}
	}
	if ends != 1 {
		t.Fatalf("binding ended %d times, want exactly once", ends)
	}
}
