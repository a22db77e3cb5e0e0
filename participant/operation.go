package participant

import (
	"context"
	"crypto/rand"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/tokenindex"
)

// An operation is one request a connection issues on one conversation,
// answered by an A. Each request type (Enroll, Attach, Tell, Ack, Detach,
// Leave) implements it: what start must know before the operation is
// decided (spec) and the decision itself (decide) live beside each other,
// and start runs every operation the same way. A new operation is a
// request type with these two methods and its StartX.
type operation[A answer] interface {
	// spec returns what start needs before the operation is decided.
	spec() opSpec
	// decide decides the operation for connection c within batch b (see
	// step), setting *a when it answers.
	decide(c *Conn, b *batch, a *A) (complete func(writeErr error) error)
}

// opSpec is what start knows of an operation before deciding it.
type opSpec struct {
	// name names the operation for the Observer.
	name string
	// conv is the conversation it is queued on.
	conv ConversationID
	// creates admits a conversation that does not exist yet (enroll).
	creates bool
	// tok names the token index entry decide looks up first, if any.
	tok tokenRef
}

// answer is an operation's answer, as the Observer classifies it.
type answer interface {
	// outcome returns "replay" for an answer that repeats an earlier
	// commit, "noop" for one that changed nothing, "" otherwise.
	outcome() string
}

// earlyRefuser is implemented by an operation that refuses, before it
// touches its conversation, what needs none of its state (enroll:
// refuseStateless).
type earlyRefuser interface {
	refuseEarly(ctx context.Context, c *Conn) error
}

// start queues req on its conversation for c and returns its Call, whose
// Wait reports the outcome to the observer.
func start[A answer](ctx context.Context, c *Conn, req operation[A]) *Call[A] {
	call := &Call[A]{}
	sp := req.spec()
	began := time.Now()
	observed := func(err error) error {
		c.svc.observe(sp.name, began, &err, call.v.outcome())
		return err
	}
	if r, ok := req.(earlyRefuser); ok {
		if err := r.refuseEarly(ctx, c); err != nil {
			err = observed(err)
			call.wait = func() error { return err }
			return call
		}
	}
	t, wait, err := c.queue(ctx, sp, func(b *batch) func(error) error { return req.decide(c, b, &call.v) }, began)
	if err != nil {
		call.wait = func() error { return observed(err) }
		return call
	}
	call.stages = &t.stages
	call.wait = func() error { return observed(wait()) }
	return call
}

func (a Bound) outcome() string { return replayOutcome(a.Replay) }
func (a Told) outcome() string  { return replayOutcome(a.Replay) }
func (a Ended) outcome() string { return replayOutcome(a.Replay) }

func (a Acked) outcome() string {
	if a.Noop {
		return "noop"
	}
	return ""
}

func replayOutcome(r Replay) string {
	if r != ReplayNone {
		return "replay"
	}
	return ""
}

// Enroll creates a participant (and the conversation on first use) and
// binds it to this connection. Errors are *Error.
func (c *Conn) Enroll(ctx context.Context, req Enroll) (Bound, error) {
	return c.StartEnroll(ctx, req).Wait()
}

// StartEnroll queues an Enroll on its conversation and returns at once; see Call.
func (c *Conn) StartEnroll(ctx context.Context, req Enroll) *Call[Bound] {
	return start[Bound](ctx, c, &req)
}

func (r *Enroll) spec() opSpec {
	return opSpec{name: "enroll", conv: r.Conversation, creates: true, tok: tokenRef{has: true, enroll: true, t: r.Token}}
}

func (r *Enroll) refuseEarly(ctx context.Context, c *Conn) error {
	return c.svc.refuseStateless(ctx, c, r)
}

func (r *Enroll) decide(c *Conn, b *batch, a *Bound) func(error) error {
	st := b.st
	pr, tw, err := b.lookup(tokenindex.Enroll, anyRow, r.Token)
	if err != nil {
		return settled(err)
	}
	if pr != nil {
		bound, e := c.svc.replayer(b.cv.id).enroll(st, pr, r)
		*a = bound
		return settled(asError(e))
	}
	d := c.decider(b.cv.id)
	slot := c.reserveBinding(d)
	row, e := d.enroll(st, r)
	if e != nil {
		slot.release()
		return settled(e)
	}
	o := &op{row: row, tok: &tw, binds: true, slot: slot}
	if st.Applied == 0 {
		if e := c.admitCreate(); e != nil {
			slot.release()
			return settled(e)
		}
		g := oplog.Row{Kind: oplog.KindGenesis, At: d.at()}
		if _, err := rand.Read(g.Nonce[:]); err != nil {
			slot.release()
			return settled(unavailable("minting the conversation nonce", err))
		}
		if !b.cv.counted {
			// A new conversation takes a slot of MaxConversations now,
			// when it is decided, so that concurrent first enrolls of
			// different conversations cannot overshoot the cap. A fresh
			// ownership grant (cluster mode) registers the entry but
			// takes no slot: only what a load finds stored does.
			if e := c.svc.conversationSlots.reserve(); e != nil {
				slot.release()
				return settled(e)
			}
			b.reservedSlot = true
		}
		o.genesis = &g
	}
	if e := b.admitRecords(c.share, nil); e != nil {
		slot.release()
		if o.genesis != nil && b.reservedSlot && !b.cv.counted {
			c.svc.conversationSlots.release()
			b.reservedSlot = false
		}
		return settled(e)
	}
	return holding(b.cv, slot, b.commit(o, func() { *a = boundAnswer(d.key, b.st.Nonce, b.cv.id, &row, c.svc.opts.ReceiptTTL) }))
}

// Attach presents a credential, mints the next generation and a new secret,
// and binds the participant to this connection, superseding any binding it
// held elsewhere (or here). Errors are *Error.
func (c *Conn) Attach(ctx context.Context, req Attach) (Bound, error) {
	return c.StartAttach(ctx, req).Wait()
}

// StartAttach queues an Attach on its conversation and returns at once; see Call.
func (c *Conn) StartAttach(ctx context.Context, req Attach) *Call[Bound] {
	return start[Bound](ctx, c, &req)
}

func (r *Attach) spec() opSpec {
	return opSpec{name: "attach", conv: r.Conversation, tok: tokenRef{has: true, p: r.Participant, t: r.Token}}
}

func (r *Attach) decide(c *Conn, b *batch, a *Bound) func(error) error {
	st := b.st
	pr, tw, err := b.lookupParticipant(r.Participant, r.Token)
	if err != nil {
		return settled(err)
	}
	if pr != nil {
		bound, e := c.svc.replayer(b.cv.id).attach(st, pr, r)
		*a = bound
		return settled(asError(e))
	}
	d := c.decider(b.cv.id)
	var slot *bindingSlot
	if _, here := d.boundHere(st); !here {
		slot = c.reserveBinding(d)
	}
	row, e := d.attach(st, r)
	if e != nil {
		slot.release()
		return settled(e)
	}
	if e := b.admitRecords(c.share, func() bool { return waiting(st, r.Participant) }); e != nil {
		slot.release()
		return settled(e)
	}
	m := st.Member(r.Participant)
	o := &op{row: row, tok: &tw, binds: true, slot: slot}
	if m.Bound {
		o.ending = b.endingOf(r.Participant)
		o.ended = &superseded{conn: m.Conn, p: r.Participant}
	}
	return holding(b.cv, slot, b.commit(o, func() { *a = boundAnswer(d.key, b.st.Nonce, b.cv.id, &row, c.svc.opts.ReceiptTTL) }))
}

// Tell appends a record to the conversation. Errors are *Error.
func (c *Conn) Tell(ctx context.Context, req Tell) (Told, error) {
	return c.StartTell(ctx, req).Wait()
}

// StartTell queues a Tell on its conversation and returns at once; see Call.
func (c *Conn) StartTell(ctx context.Context, req Tell) *Call[Told] {
	return start[Told](ctx, c, &req)
}

func (r *Tell) spec() opSpec {
	return opSpec{name: "tell", conv: r.Conversation, tok: tokenRef{has: true, p: r.Participant, t: r.Token}}
}

func (r *Tell) decide(c *Conn, b *batch, a *Told) func(error) error {
	pr, tw, err := b.lookupParticipant(r.Participant, r.Token)
	if err != nil {
		return settled(err)
	}
	if pr != nil {
		told, e := c.svc.replayer(b.cv.id).tell(pr, r)
		*a = told
		return settled(asError(e))
	}
	row, e := c.decider(b.cv.id).tell(b.st, r)
	if e != nil {
		return settled(e)
	}
	if e := b.admitRecords(c.share, nil); e != nil {
		return settled(e)
	}
	return b.commit(&op{row: row, tok: &tw}, func() { *a = Told{Conversation: b.cv.id, Seq: row.Seq} })
}

// Ack advances the participant's cursor. Errors are *Error.
func (c *Conn) Ack(ctx context.Context, req Ack) (Acked, error) {
	return c.StartAck(ctx, req).Wait()
}

// StartAck queues an Ack on its conversation and returns at once; see Call.
func (c *Conn) StartAck(ctx context.Context, req Ack) *Call[Acked] {
	return start[Acked](ctx, c, &req)
}

func (r *Ack) spec() opSpec { return opSpec{name: "ack", conv: r.Conversation} }

func (r *Ack) decide(c *Conn, b *batch, a *Acked) func(error) error {
	row, noop, e := c.decider(b.cv.id).ack(b.st, r)
	if e != nil {
		return settled(e)
	}
	if noop {
		*a = Acked{Conversation: b.cv.id, Participant: r.Participant, Cursor: r.Through, Noop: true}
		return settled(nil)
	}
	return b.commit(&op{row: row}, func() {
		*a = Acked{Conversation: b.cv.id, Participant: r.Participant, Cursor: row.Through}
	})
}

// Detach ends the participant's binding cleanly. Errors are *Error.
func (c *Conn) Detach(ctx context.Context, req Detach) (Ended, error) {
	return c.StartDetach(ctx, req).Wait()
}

// StartDetach queues a Detach on its conversation and returns at once; see Call.
func (c *Conn) StartDetach(ctx context.Context, req Detach) *Call[Ended] {
	return start[Ended](ctx, c, &req)
}

func (r *Detach) spec() opSpec {
	return opSpec{name: "detach", conv: r.Conversation, tok: tokenRef{has: true, p: r.Participant, t: r.Token}}
}

func (r *Detach) decide(c *Conn, b *batch, a *Ended) func(error) error {
	return decideEnded(c, b, a, oplog.KindDetach, r.Participant, r.Token,
		func(d *decider, st *outbox.State) (oplog.Row, *Error) { return d.detach(st, r) })
}

// Leave retires the participant, ending its binding if it has one. Errors
// are *Error.
func (c *Conn) Leave(ctx context.Context, req Leave) (Ended, error) {
	return c.StartLeave(ctx, req).Wait()
}

// StartLeave queues a Leave on its conversation and returns at once; see Call.
func (c *Conn) StartLeave(ctx context.Context, req Leave) *Call[Ended] {
	return start[Ended](ctx, c, &req)
}

func (r *Leave) spec() opSpec {
	return opSpec{name: "leave", conv: r.Conversation, tok: tokenRef{has: true, p: r.Participant, t: r.Token}}
}

func (r *Leave) decide(c *Conn, b *batch, a *Ended) func(error) error {
	return decideEnded(c, b, a, oplog.KindLeave, r.Participant, r.Token,
		func(d *decider, st *outbox.State) (oplog.Row, *Error) { return d.leave(st, r) })
}

// decideEnded decides the operations answered by Ended, detach and leave
// (kind): both end p's binding if it has one, and replay from their row's
// seq.
func decideEnded(c *Conn, b *batch, a *Ended, kind oplog.Kind, p ParticipantID, tok Token,
	decideRow func(*decider, *outbox.State) (oplog.Row, *Error)) func(error) error {
	pr, tw, err := b.lookupParticipant(p, tok)
	if err != nil {
		return settled(err)
	}
	if pr != nil {
		ended, e := c.svc.replayer(b.cv.id).ended(pr, kind)
		*a = ended
		return settled(asError(e))
	}
	row, e := decideRow(c.decider(b.cv.id), b.st)
	if e != nil {
		return settled(e)
	}
	o := &op{row: row, tok: &tw}
	if b.st.Member(p).Bound {
		o.ending = b.endingOf(p)
		o.ended = &superseded{conn: row.Conn, p: p}
	}
	return b.commit(o, func() { *a = Ended{Conversation: b.cv.id, Participant: p, Seq: row.Seq} })
}
