package server_test

import (
	"errors"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// TestPipelinedEnrollDetach_BothAnswered sends enroll (of a new
// conversation) and detach of the binding it creates, participant 0
// generation 1, as two frames in one TCP write, so that both are decided
// in one batch: both are answered, another client on another conversation
// is served meanwhile, and the drain finishes within the drain timeout.
func TestPipelinedEnrollDetach_BothAnswered(t *testing.T) {
	const drainTimeout = 5 * time.Second
	h := start(t, server.Config{DrainTimeout: drainTimeout})
	other := h.dial()
	ocred := other.enroll(2)

	c := h.dial()
	enroll := &wire.Enroll{ID: c.id(), Conversation: 1, Token: token()}
	detach := &wire.Detach{ID: c.id(), Conversation: 1, Participant: 0, Generation: 1, Token: token()}
	c.sendBytes(append(wire.AppendFrame(nil, enroll), wire.AppendFrame(nil, detach)...))
	if e, ok := c.next().(*wire.Enrolled); !ok || e.ID != enroll.ID || e.Participant != 0 || e.Generation != 1 {
		t.Fatalf("enroll answered %#v, want enrolled participant 0 generation 1", e)
	}
	if d, ok := c.next().(*wire.Detached); !ok || d.ID != detach.ID {
		t.Fatalf("detach answered %#v, want detached", d)
	}
	// The conversation's turn is free again: a later operation on it is
	// decided too.
	c.enroll(1)
	other.tell(ocred, "unaffected")

	began := time.Now()
	if err := h.shutdown(); err != nil {
		t.Fatalf("Run after the drain = %v, want nil", err)
	}
	if took := time.Since(began); took > drainTimeout {
		t.Errorf("drain took %v, more than the drain timeout %v", took, drainTimeout)
	}
}

// TestPipelinedAttachDetach_BothAnswered sends attach(g) and detach(g+1)
// of the binding the attach creates in one write, then attach and bye in
// one write: every request is answered, and the drain does not time out.
func TestPipelinedAttachDetach_BothAnswered(t *testing.T) {
	h := start(t, server.Config{DrainTimeout: 5 * time.Second})
	const conv = 3
	a := h.dial()
	cr := a.enroll(conv)
	a.call(&wire.Detach{ID: a.id(), Conversation: conv, Participant: cr.p, Generation: cr.gen, Token: token()})

	b := h.dial()
	at := &wire.Attach{ID: b.id(), Conversation: conv, Participant: cr.p, Generation: cr.gen, Secret: cr.secret, Token: token()}
	dt := &wire.Detach{ID: b.id(), Conversation: conv, Participant: cr.p, Generation: cr.gen + 1, Token: token()}
	b.sendBytes(append(wire.AppendFrame(nil, at), wire.AppendFrame(nil, dt)...))
	attached, ok := b.next().(*wire.Attached)
	if !ok || attached.ID != at.ID || attached.Generation != cr.gen+1 {
		t.Fatalf("attach answered %#v, want attached generation %d", attached, cr.gen+1)
	}
	if d, ok := b.next().(*wire.Detached); !ok || d.ID != dt.ID {
		t.Fatalf("detach answered %#v, want detached", d)
	}

	// attach, then the connection's end right behind it.
	c := h.dial()
	c.sendBytes(append(wire.AppendFrame(nil, &wire.Attach{ID: c.id(), Conversation: conv, Participant: cr.p,
		Generation: attached.Generation, Secret: attached.Secret, Token: token()}),
		wire.AppendFrame(nil, &wire.Bye{ID: c.id()})...))
	last, ok := c.next().(*wire.Attached)
	if !ok {
		t.Fatalf("attach answered %#v, want attached", last)
	}
	c.expectClosed()
	// The binding ended with the connection, so the conversation's turn is
	// free: the participant attaches again from elsewhere.
	a.attach(cred{conv, cr.p, last.Generation, last.Secret})

	if err := h.shutdown(); errors.Is(err, server.ErrDrainTimeout) {
		t.Fatalf("Run after the drain = %v", err)
	}
}
