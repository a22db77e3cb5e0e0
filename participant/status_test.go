package participant

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store"
)

// TestService_Status_ReportsBindingsCursorsAndBacklog: a sender that
// never reads and a reader that read three records and acknowledged one.
// Status names each member's generation and binding, the reader's cursor,
// what its connection pushed and what it still holds back, and the
// conversation's retained records; after the reader's connection ends, its
// binding and offer are gone.
func TestService_Status_ReportsBindingsCursorsAndBacklog(t *testing.T) {
	ctx := context.Background()
	svc := openService(t, store.NewMemory())
	if _, ok := svc.Status(7); ok {
		t.Fatal("Status(7) of an empty service = ok, want no such conversation")
	}
	var w wakeCounter
	sc, rc := svc.Connect(w.wake), svc.Connect(w.wake)
	sender := mustEnroll(t, sc, 7, 1)
	reader := mustEnroll(t, rc, 7, 2)
	for i := range 3 {
		if _, err := sc.Tell(ctx, Tell{Conversation: 7, Participant: sender.Participant, Generation: sender.Generation,
			Token: token(byte(10 + i)), Payload: []byte("hello")}); err != nil {
			t.Fatal(err)
		}
	}
	got := drainNext(rc, 7)
	if len(got) != 3 {
		t.Fatalf("reader got %d deliveries, want 3", len(got))
	}
	if _, err := rc.Ack(ctx, Ack{Conversation: 7, Participant: reader.Participant, Generation: reader.Generation, Through: got[0].Seq}); err != nil {
		t.Fatal(err)
	}

	// Seqs: 1 the sender joined (nobody to tell), 2 the reader joined (to
	// the sender, who never reads), 3..5 the records (to the reader).
	want := Status{
		Conversation: 7, Held: true, Loaded: true, Applied: 7, LastSeq: 5, // genesis, 2 enrolls, 3 tells, the ack
		Retained: 4, FirstRetained: 2, PayloadBytes: 15,
		Participants: []ParticipantStatus{
			{Participant: sender.Participant, Generation: 1, Bound: true, Conn: sc.ID(), Unacked: 1},
			{Participant: reader.Participant, Generation: 1, Bound: true, Conn: rc.ID(), Acked: 3, Offered: 5, Unacked: 2},
		},
	}
	st, ok := svc.Status(7)
	if !ok {
		t.Fatal("Status(7) = not found after two enrolls")
	}
	if diff := cmp.Diff(want, st, cmpopts.IgnoreUnexported(ConnID{})); diff != "" {
		t.Errorf("Status (-want +got):\n%s", diff)
	}

	if err := rc.End(ctx, oplog.CauseConnectionLost); err != nil {
		t.Fatal(err)
	}
	st, _ = svc.Status(7)
	if p := st.Participants[1]; p.Bound || p.Offered != 0 || p.Conn != (ConnID{}) || p.Acked != 3 {
		t.Errorf("reader after its connection ended = %+v, want unbound, cursor 3, no offer", p)
	}
	if st.LastSeq != 6 {
		t.Errorf("LastSeq after the reader died = %v, want #6 (its died record)", st.LastSeq)
	}
}
