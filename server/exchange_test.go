package server_test

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

func cause(c wire.Cause) *wire.Cause { return &c }

func TestExchange_RecordsAcksReplaysSupersession(t *testing.T) {
	h := start(t, server.Config{})
	const conv = 7
	a, b := h.dial(), h.dial()
	ca := a.enroll(conv)
	cb := b.enroll(conv)
	if ca.p != 0 || cb.p != 1 || ca.gen != 1 {
		t.Fatalf("participants %d, %d gen %d; want 0, 1 gen 1", ca.p, cb.p, ca.gen)
	}
	// A hears B join (seq 2).
	got := a.delivery()
	want := &wire.Delivery{Conversation: conv, Recipient: 0, Seq: 2, Kind: wire.KindJoined, Participant: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("A's first delivery (-want +got):\n%s", diff)
	}

	// A tells; B gets the record.
	tok := token()
	told, ok := a.call(&wire.Tell{ID: a.id(), Conversation: conv, Participant: 0, Generation: 1, Token: tok, Payload: []byte("hi")}).(*wire.Told)
	if !ok || told.Seq != 3 || told.Replay != nil {
		t.Fatalf("tell answered %#v, want told seq 3", told)
	}
	got = b.delivery()
	want = &wire.Delivery{Conversation: conv, Recipient: 1, Seq: 3, Kind: wire.KindRecord, Participant: 0, Payload: []byte("hi")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("B's delivery (-want +got):\n%s", diff)
	}

	// The retried tell replays its seq; a different payload conflicts.
	rep := a.call(&wire.Tell{ID: a.id(), Conversation: conv, Participant: 0, Generation: 1, Token: tok, Payload: []byte("hi")})
	if r, ok := rep.(*wire.Told); !ok || r.Seq != 3 || r.Replay == nil || *r.Replay != wire.ReplayCommitted {
		t.Fatalf("retried tell answered %#v, want told seq 3 replay committed", rep)
	}
	conflict := a.call(&wire.Tell{ID: a.id(), Conversation: conv, Participant: 0, Generation: 1, Token: tok, Payload: []byte("ho")})
	if e, ok := conflict.(*wire.Error); !ok || e.Code != wire.CodeTokenConflict {
		t.Fatalf("conflicting tell answered %#v, want token_conflict", conflict)
	}

	// Acks: through 3 advances, again is a noop, 2 is a regression, 9 a gap.
	for _, tc := range []struct {
		through uint64
		want    wire.Message
	}{
		{3, &wire.Acked{Conversation: conv, Participant: 1, Cursor: 3}},
		{3, &wire.Acked{Conversation: conv, Participant: 1, Cursor: 3, Noop: true}},
		{2, &wire.Error{Code: wire.CodeAckRegression, Cursor: ptr(uint64(3))}},
		{9, &wire.Error{Code: wire.CodeAckGap, Cursor: ptr(uint64(3))}},
	} {
		got := b.call(&wire.Ack{ID: b.id(), Conversation: conv, Participant: 1, Generation: 1, Through: tc.through})
		switch g := got.(type) {
		case *wire.Acked:
			g.ID = 0
		case *wire.Error:
			g.ID, g.Detail = 0, ""
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ack through %d (-want +got):\n%s", tc.through, diff)
		}
	}

	// A wrong secret is stale_authority without a generation; a too large
	// payload is too_large with the limit.
	bad := a.call(&wire.Attach{ID: a.id(), Conversation: conv, Participant: 1, Generation: 1, Token: token()})
	if e, ok := bad.(*wire.Error); !ok || e.Code != wire.CodeStaleAuthority || e.Generation != nil {
		t.Fatalf("attach with a wrong secret answered %#v", bad)
	}
	big := a.call(&wire.Tell{ID: a.id(), Conversation: conv, Participant: 0, Generation: 1, Token: token(), Payload: make([]byte, h.srv.Service().Options().MaxRecordBytes+1)})
	if e, ok := big.(*wire.Error); !ok || e.Code != wire.CodeTooLarge || e.Limit == nil {
		t.Fatalf("oversized tell answered %#v", big)
	}

	// C attaches B's credential: B's binding there ends as
	// detached/superseded, which A hears, then the attach.
	c := h.dial()
	cb2 := c.attach(cb)
	if cb2.gen != 2 {
		t.Fatalf("attach minted generation %d, want 2", cb2.gen)
	}
	d := a.delivery()
	want = &wire.Delivery{Conversation: conv, Recipient: 0, Seq: 4, Kind: wire.KindDetached, Participant: 1, Cause: cause(wire.CauseSuperseded)}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Fatalf("A's delivery after the supersession (-want +got):\n%s", diff)
	}
	if d := a.delivery(); d.Kind != wire.KindAttached || d.Participant != 1 || d.Seq != 5 {
		t.Fatalf("A's next delivery %+v, want attached of 1 at seq 5", d)
	}
	// The old binding is gone: B's tell is no_binding; C's works and A
	// gets it.
	if e, ok := b.call(&wire.Tell{ID: b.id(), Conversation: conv, Participant: 1, Generation: 1, Token: token()}).(*wire.Error); !ok || e.Code != wire.CodeStaleAuthority && e.Code != wire.CodeNoBinding {
		t.Fatalf("tell on the superseded binding answered %#v", e)
	}
	c.tell(cb2, "from c")
	if d := a.delivery(); d.Kind != wire.KindRecord || string(d.Payload) != "from c" {
		t.Fatalf("A got %+v, want C's record", d)
	}
}

func ptr[T any](v T) *T { return &v }

func TestExchange_PipelinedOrderPerConversation(t *testing.T) {
	h := start(t, server.Config{})
	c := h.dial()
	const convs, tells = 8, 50
	creds := make([]cred, convs)
	for i := range creds {
		creds[i] = c.enroll(uint64(1000 + i))
	}
	// Every tell goes out before any answer is read.
	ids := make(map[uint64][2]int)
	for n := range tells {
		for i, cr := range creds {
			id := c.id()
			ids[id] = [2]int{i, n}
			c.send(&wire.Tell{ID: id, Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte(fmt.Sprint(n))})
		}
	}
	last := make([]uint64, convs)
	for range convs * tells {
		told, ok := c.next().(*wire.Told)
		if !ok {
			t.Fatalf("pipelined tell answered %#v", told)
		}
		in, ok := ids[told.ID]
		if !ok {
			t.Fatalf("answer to unknown id %d", told.ID)
		}
		delete(ids, told.ID)
		if told.Seq <= last[in[0]] {
			t.Fatalf("conversation %d: seq %d answered after seq %d", told.Conversation, told.Seq, last[in[0]])
		}
		if want := uint64(2 + in[1]); told.Seq != want {
			t.Fatalf("tell #%d of conversation %d got seq %d, want %d", in[1], told.Conversation, told.Seq, want)
		}
		last[in[0]] = told.Seq
	}
}

func TestExchange_CapacityExceededCarriesLimit(t *testing.T) {
	h := start(t, server.Config{MaxParticipants: 1})
	a, b := h.dial(), h.dial()
	a.enroll(20)
	m := b.call(&wire.Enroll{ID: b.id(), Conversation: 20, Token: token()})
	if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeCapacityExceeded || e.Limit == nil || *e.Limit != 1 {
		t.Fatalf("second enroll answered %#v, want capacity_exceeded limit 1", m)
	}
}
