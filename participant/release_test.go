package participant

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// A deaf participant (one that never acknowledges) pins nothing past
// MaxUnackedAge: a compaction pass releases the records older than it,
// the deaf one's next delivery is the compacted notice naming the first
// record that still exists, then the records that follow; an ack below
// that is refused compacted; the notice survives a restart from the
// checkpoint; and once the retention passes the released rows go.
func TestRelease_DeafParticipantGetsCompactedNoticeAfterMaxUnackedAge(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, MaxUnackedAge: time.Hour, Now: clk.Now}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	a, deaf := svc.Connect(nil), svc.Connect(nil)
	ab := mustEnroll(t, a, 1, 1)
	db := mustEnroll(t, deaf, 1, 2)
	joined := drainNext(a, 1)
	if _, err := a.Ack(ctx, Ack{Conversation: 1, Participant: ab.Participant, Generation: ab.Generation, Through: joined[len(joined)-1].Seq}); err != nil {
		t.Fatalf("a acks the deaf one's joining: %v", err)
	}
	tell := func(tok byte) Seq {
		t.Helper()
		told, err := a.Tell(ctx, Tell{Conversation: 1, Participant: ab.Participant, Generation: ab.Generation, Token: token(tok), Payload: []byte{tok}})
		must(t, err)
		return told.Seq
	}
	var old []Seq
	for i := range 5 {
		old = append(old, tell(byte(10+i)))
	}
	clk.advance(30 * time.Minute)
	fresh := []Seq{tell(20), tell(21)}

	got, err := svc.CompactPass(ctx)
	must(t, err)
	if got.Released != 0 {
		t.Fatalf("CompactPass() before max-unacked-age released %d records, want 0", got.Released)
	}
	clk.advance(40 * time.Minute)
	if got, err = svc.CompactPass(ctx); err != nil || got.Released != uint64(len(old)) {
		t.Fatalf("CompactPass() past max-unacked-age = %+v, %v, want %d released", got, err, len(old))
	}
	if n := svc.Lifecycle().RecordsReleased; n != uint64(len(old)) {
		t.Errorf("RecordsReleased = %d, want %d", n, len(old))
	}

	first := old[len(old)-1] + 1
	checkDeliveries := func(c *Conn) {
		t.Helper()
		ds := drainNext(c, 1)
		// After a restart, the end of a's binding follows.
		if len(ds) < 1+len(fresh) || ds[0].First != first || ds[0].Seq != first-1 {
			t.Fatalf("the deaf one's deliveries = %+v, want the compacted notice (first %v), then %v", ds, first, fresh)
		}
		for i, q := range fresh {
			if d := ds[1+i]; d.First != 0 || d.Seq != q || d.Kind != outbox.KindRecord {
				t.Errorf("delivery %d after the notice = %+v, want record %v", 1+i, d, q)
			}
		}
	}
	checkDeliveries(deaf)
	_, err = deaf.Ack(ctx, Ack{Conversation: 1, Participant: db.Participant, Generation: db.Generation, Through: old[1]})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeCompacted || pe.First != first {
		t.Fatalf("ack of released record %v = %v, want compacted with first %v", old[1], err, first)
	}

	// From the checkpoint, after a restart, the notice is still owed.
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	must(t, svc.Close())
	svc, err = Open(ctx, mem, opts)
	must(t, err)
	defer svc.Close()
	deaf = svc.Connect(nil)
	db, err = deaf.Attach(ctx, Attach{Conversation: 1, Participant: db.Participant, Generation: db.Generation, Secret: db.Secret, Token: token(30)})
	must(t, err)
	checkDeliveries(deaf)

	// The released rows go once the retention passed, deaf or not.
	clk.advance(2 * time.Minute)
	if n, err := svc.CheckpointPass(ctx); err != nil || n != 1 {
		t.Fatalf("CheckpointPass() = %d, %v, want 1, nil", n, err)
	}
	clk.advance(2 * time.Minute)
	_, err = svc.CompactPass(ctx)
	must(t, err)
	if f := firstOf(t, mem, oplog.Stream(1)); f == 0 {
		t.Errorf("after the retention, oplog first row = %d, want the released rows trimmed", f)
	}
	if _, err := deaf.Ack(ctx, Ack{Conversation: 1, Participant: db.Participant, Generation: db.Generation, Through: fresh[1]}); err != nil {
		t.Errorf("ack of a record after the notice: %v", err)
	}
}
