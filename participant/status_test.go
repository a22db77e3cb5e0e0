package participant

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
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

// TestService_Status_ConsistentUnderTraffic takes snapshots while a sender
// tells and a reader reads and acknowledges, pipelined, so that the race
// detector sees Status beside commits, publications and Next; every
// snapshot must be self-consistent, and the last one must show the reader
// caught up.
func TestService_Status_ConsistentUnderTraffic(t *testing.T) {
	ctx := context.Background()
	// A backlog budget of a few payloads: eviction writes the published
	// state in place, under its write lock, while Status reads it.
	svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, MaxBacklogBytes: 512})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	wake := make(chan struct{}, 1)
	sc := svc.Connect(func() {})
	rc := svc.Connect(func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	sender := mustEnroll(t, sc, 3, 1)
	reader := mustEnroll(t, rc, 3, 2)
	const tells = 200
	var last Seq
	senderDone := make(chan error, 1)
	go func() {
		var calls []*Call[Told]
		for i := range tells {
			calls = append(calls, sc.StartTell(ctx, Tell{Conversation: 3, Participant: sender.Participant, Generation: sender.Generation,
				Token: Token{9, byte(i), byte(i >> 8)}, Payload: make([]byte, 64)}))
		}
		for _, c := range calls {
			if _, err := c.Wait(); err != nil {
				senderDone <- err
				return
			}
		}
		senderDone <- nil
	}()
	readerDone := make(chan error, 1)
	go func() {
		read := 0
		for read < tells {
			d, ok := rc.Next(3)
			if !ok {
				// Empty the inbox, so that the next publication wakes
				// the reader, and look again before waiting for it.
				rc.TakeReady()
				if d, ok = rc.Next(3); !ok {
					<-wake
					continue
				}
			}
			if d.Kind == outbox.KindRecord {
				read++
			}
			if _, err := rc.Ack(ctx, Ack{Conversation: 3, Participant: reader.Participant, Generation: reader.Generation, Through: d.Seq}); err != nil {
				readerDone <- err
				return
			}
			last = d.Seq
		}
		readerDone <- nil
	}()
	check := func(st Status) {
		t.Helper()
		if !st.Loaded || len(st.Participants) != 2 || (st.Retained > 0) != (st.FirstRetained != 0) || st.FirstRetained > st.LastSeq {
			t.Fatalf("inconsistent snapshot %+v", st)
		}
		for _, p := range st.Participants {
			if p.Unacked > st.Retained || p.Acked > st.LastSeq || (p.Bound && p.Offered < p.Acked) {
				t.Fatalf("inconsistent participant %+v in %+v", p, st)
			}
		}
	}
	for done := 0; done < 2; {
		select {
		case err := <-senderDone:
			must(t, err)
			done++
		case err := <-readerDone:
			must(t, err)
			done++
		default:
			st, ok := svc.Status(3)
			if !ok {
				t.Fatal("Status(3) = not found under traffic")
			}
			check(st)
		}
	}
	st, _ := svc.Status(3)
	check(st)
	if r := st.Participants[reader.Participant]; r.Acked != last || r.Offered != last || r.Unacked != 0 {
		t.Errorf("reader after it caught up = %+v, want acked and offered %v, nothing held back", r, last)
	}
}

// TestService_Status_ContainedConversation: a conversation whose stored
// outbox is corrupt is contained at start; Status still finds it and says
// why, with nothing loaded.
func TestService_Status_ContainedConversation(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	svc := openService(t, mem)
	mustEnroll(t, svc.Connect(nil), 4, 1)
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 4, Token: token(2)}); err != nil {
		t.Fatal(err)
	}
	mem.Crash()
	// A row whose source goes backwards: a corrupt outbox.
	bad, err := outbox.Encode(&outbox.Row{Kind: outbox.AckAdvanced, Source: 1, Participant: 0, Through: 1})
	must(t, err)
	n, err := mem.Len(outbox.Stream(4))
	must(t, err)
	_, err = mem.Append(outbox.Stream(4), bad, n)
	must(t, err)
	must(t, mem.Flush())

	svc = openService(t, mem)
	st, ok := svc.Status(4)
	if !ok {
		t.Fatal("Status(4) of a contained conversation = not found")
	}
	if st.Loaded || st.Unloadable == nil || st.Unloadable.Class != ClassOutboxCorrupt || st.Participants != nil {
		t.Errorf("Status(4) = %+v (unloadable %+v), want not loaded, contained as %s, no participants", st, st.Unloadable, ClassOutboxCorrupt)
	}
}
