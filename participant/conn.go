package participant

import (
	"errors"
	"slices"
	"sort"
	"sync"

	"github.com/participantd/participantd/oplog"
)

// Conn is one client connection's handle on the service: it issues the
// connection's operations, holds its inbox of ready conversations, and ends
// its bindings when the connection ends.
//
// Operations may be called concurrently; operations on one conversation are
// applied in the order they acquire the conversation, so a caller that needs
// the protocol's per-conversation order issues them in order.
type Conn struct {
	svc  *Service
	id   ConnID
	wake func()
	// creates paces the conversations the connection creates; set before
	// its first operation (LimitCreates), read-only after.
	creates CreateLimit
	// share is the account of the principal the connection acts for, nil
	// for nobody (see share.go).
	share *share

	// mu guards the fields below.
	mu sync.Mutex
	// ready is the set of conversations with something to publish to this
	// connection; order keeps their arrival order.
	// +checklocks:mu
	ready map[ConversationID]struct{}
	// +checklocks:mu
	order []ConversationID
	// bindings maps each conversation this connection is bound in to the
	// participant bound.
	// +checklocks:mu
	bindings map[ConversationID]ParticipantID
	// offered holds, per bound conversation, the last delivery Next
	// handed out: where Next continues and what Status reports; an entry
	// of an earlier binding is told apart by its epoch.
	// +checklocks:mu
	offered map[ConversationID]Offered
	// reserved counts the binding slots (bindingSlot) held by enrolls and
	// attaches that were decided and are not yet published in bindings or
	// given back: with pipelining, conversations decide in parallel, so the
	// cap counts them. A slot leaves it when its binding enters bindings,
	// in the same hold of mu (bind).
	// +checklocks:mu
	reserved int
	// parked holds the slots of c parked on conversations (park), each
	// with its conversation, so that End gives them back: a conversation
	// that never loads again would otherwise hold the ended connection.
	// A slot leaves it when it is given back (giveBackLocked).
	// +checklocks:mu
	parked map[*bindingSlot]*conversation
	// ended is set by End, with the cause it was given; no operation
	// starts after it.
	// +checklocks:mu
	ended bool
	// +checklocks:mu
	endCause Cause
	// inflight counts operations started and not finished.
	inflight sync.WaitGroup
}

// ID returns the connection incarnation.
func (c *Conn) ID() ConnID { return c.id }

// CreateLimit paces the conversations one client creates (the server
// keeps a bucket per peer address).
type CreateLimit struct {
	// Allow reports whether the connection may create one more
	// conversation now, and takes that allowance when it may. It is
	// called once per enroll that would create a conversation, from the
	// goroutines deciding operations, so concurrently; it must not block.
	// Nil allows every one.
	Allow func() bool
	// Exhausted reports, without taking anything, whether Allow would
	// refuse now: the check an enroll makes before it touches a
	// conversation (refuseStateless). Nil: never.
	Exhausted func() bool
	// Rate (a second) and Burst describe the pace, for the refusal.
	Rate  float64
	Burst int
}

// LimitCreates paces the conversations c's enrolls create: an enroll that
// would create one is rate_limited, with limit l.Burst, when l.Allow
// refuses. Call it before c's first operation.
func (c *Conn) LimitCreates(l CreateLimit) { c.creates = l }

// admitCreate asks c's CreateLimit for one more conversation.
func (c *Conn) admitCreate() *Error {
	if c.creates.Allow == nil || c.creates.Allow() {
		return nil
	}
	return c.rateLimited()
}

// createsExhausted is admitCreate's refusal when c's CreateLimit has
// nothing left now, taking nothing; nil otherwise.
func (c *Conn) createsExhausted() *Error {
	if c.creates.Exhausted == nil || !c.creates.Exhausted() {
		return nil
	}
	return c.rateLimited()
}

// rateLimited is the refusal of c's CreateLimit.
func (c *Conn) rateLimited() *Error {
	e := refuse(CodeRateLimited, "this client creates conversations faster than %g a second (a burst of %d); retry later",
		c.creates.Rate, c.creates.Burst)
	e.Limit = uint64(c.creates.Burst)
	return e
}

// markReady puts conv in the inbox and wakes the connection if the inbox
// was empty. Wakes coalesce: one wake per empty-to-non-empty transition.
func (c *Conn) markReady(conv ConversationID) {
	c.mu.Lock()
	if _, ok := c.ready[conv]; ok {
		c.mu.Unlock()
		return
	}
	c.ready[conv] = struct{}{}
	c.order = append(c.order, conv)
	first := len(c.order) == 1
	c.mu.Unlock()
	if first && c.wake != nil {
		c.wake()
	}
}

// HasReady reports whether the inbox holds a conversation.
func (c *Conn) HasReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.order) > 0
}

// TakeReady empties the inbox and returns the conversations it held, in the
// order they became ready. The caller then drains each with Next.
func (c *Conn) TakeReady() []ConversationID {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.order
	c.order = nil
	clear(c.ready)
	return out
}

// Bindings returns the conversations this connection is bound in, with the
// participant bound in each, in ascending conversation order.
func (c *Conn) Bindings() []Binding {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Binding, 0, len(c.bindings))
	for conv, p := range c.bindings {
		out = append(out, Binding{Conversation: conv, Participant: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Conversation < out[j].Conversation })
	return out
}

// MayHoldBinding reports whether c holds a binding (Bindings), or may:
// a binding slot is reserved for an enroll or attach being decided or
// committed, or for one whose binding may be stored but was not
// published (in doubt, or answered while its conversation was
// forgotten), until its conversation's next load settles it.
func (c *Conn) MayHoldBinding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.bindings) > 0 || c.reserved > 0
}

// Binding names one participant bound on a connection.
type Binding struct {
	Conversation ConversationID
	Participant  ParticipantID
}

// bind publishes p's binding in conv on c. A binding that reserved slot
// on c takes it over in the same hold of c.mu (giveBackLocked), so that
// the cap never counts the binding and its reservation both; slot is nil
// for a binding that reserved none (an attach on the connection already
// bound). A binding a load finds is published by rebind.
// A binding a batch commits was admitted under the cap when its slot was
// reserved, so it is published whatever the connection holds now, and
// even when c has begun to end: its operation was in flight, which End
// waits for before it lists the bindings to end.
func (c *Conn) bind(conv ConversationID, p ParticipantID, slot *bindingSlot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bindLocked(conv, p, slot)
}

// bindLocked is bind with c.mu held.
//
// +checklocks:c.mu
func (c *Conn) bindLocked(conv ConversationID, p ParticipantID, slot *bindingSlot) {
	if slot != nil && slot.c != c {
		panic("participant: a binding published on a connection other than the one holding its slot")
	}
	c.bindings[conv] = p
	c.giveBackLocked(slot)
}

// rebind publishes p's binding in conv, which a load found stored on c,
// as bind does with slot, the one its operation parked (nil for none),
// unless c cannot take it: then it publishes nothing, gives slot back,
// and returns false with the cause the load ends the binding with. c may
// have ended (End): End lists the bindings to end once, after it marked
// c ended, so a binding published after the mark would never be ended;
// the cause is End's. Or c has no room: a binding without a slot, in a
// conversation c is not bound in, takes a free one of c's max slots, and
// when none is left it ends as it would on any node that loads the
// conversation after a loss of its ownership (died/unclean_restart).
func (c *Conn) rebind(conv ConversationID, p ParticipantID, slot *bindingSlot, max int) (bool, Cause) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		c.giveBackLocked(slot)
		return false, c.endCause
	}
	if _, here := c.bindings[conv]; slot == nil && !here && len(c.bindings)+c.reserved >= max {
		return false, oplog.CauseUncleanRestart
	}
	c.bindLocked(conv, p, slot)
	return true, 0
}

func (c *Conn) unbind(conv ConversationID, p ParticipantID) {
	c.mu.Lock()
	if q, ok := c.bindings[conv]; ok && q == p {
		delete(c.bindings, conv)
		delete(c.offered, conv)
	}
	c.mu.Unlock()
}

// bindingSlot is one of a connection's MaxConversationsPerConn binding
// slots, reserved by an enroll or attach when it is decided, so that
// conversations deciding in parallel cannot together pass the cap. It is
// given back exactly once: taken over by the publication of its binding
// (bind), or released when its operation completes without one (refused,
// failed, in doubt, not published). Only the goroutine holding the turn
// of the operation's conversation uses it: decide, publish and the
// operation's completion all run there.
type bindingSlot struct {
	c *Conn
	// held is set until bind takes the slot over or release gives it back.
	// It needs no lock, as only the turn's goroutine reads or writes it;
	// it changes with c.reserved, under c.mu, all the same.
	held bool
}

// reserveBinding reserves one of c's binding slots for the enroll or
// attach d is deciding, and sets d.connBindings to the slots taken before
// it, so that d refuses capacity_exceeded when none is left (and then
// nothing is reserved: the slot is nil). The caller hands the slot to the
// op it stages (op.slot), whose publication takes it over, and releases it
// when the operation completes (holding) or is refused before staging.
func (c *Conn) reserveBinding(d *decider) *bindingSlot {
	c.mu.Lock()
	defer c.mu.Unlock()
	d.connBindings = len(c.bindings) + c.reserved
	if d.connBindings >= d.maxConnBindings {
		return nil
	}
	c.reserved++
	return &bindingSlot{c: c, held: true}
}

// giveBackLocked gives slot, one of c's, back to c's count if it still
// holds it; a nil slot holds nothing. Calling it again does nothing.
//
// +checklocks:c.mu
func (c *Conn) giveBackLocked(slot *bindingSlot) {
	if slot != nil && slot.held {
		slot.held = false
		c.reserved--
		delete(c.parked, slot)
	}
}

// release gives the slot back unless its binding was published; a nil
// slot holds nothing. Calling it again does nothing.
func (s *bindingSlot) release() {
	if s == nil {
		return
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.c.giveBackLocked(s)
}

// holding completes like complete, then settles slot if its binding was
// not published: it is given back when the operation surely wrote nothing
// (refused, failed before its rows were written), and parked on cv
// otherwise. An operation answered without its binding published (cv
// forgotten under its batch) or in doubt may have a stored binding, which
// the next load of cv binds on the connection; had the slot been given
// back, the connection could fill it meanwhile and that load would bind
// it one past its cap.
func holding(cv *conversation, slot *bindingSlot, complete func(error) error) func(error) error {
	return func(werr error) error {
		err := complete(werr)
		var pe *Error
		if err == nil || errors.As(err, &pe) && pe.Code == CodeInDoubt {
			cv.park(slot)
		} else {
			slot.release()
		}
		return err
	}
}

// park moves slot, if its binding was not published, to cv's parked
// slots: it stays reserved on its connection until cv's next load settles
// it, cv is forgotten with its ownership (Forget) or contained (contain),
// or the connection ends (End). A nil slot, or one given back, parks
// nothing; the slot of an ended connection, which binds nothing more (the
// load ends the binding it finds there), is given back, and so is one
// parked on cv after a Forget since the turn began, or on cv contained.
// It runs on the goroutine holding cv's turn.
func (cv *conversation) park(slot *bindingSlot) {
	if slot == nil {
		return
	}
	c := slot.c
	lostAt := cv.lostAt
	// Both locks, in their order, so that End, which sets ended under
	// c.mu, either finds the slot parked or makes it given back here.
	cv.mu.Lock()
	defer cv.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slot.held || c.ended || cv.lost != lostAt || cv.unloadable != nil {
		// Given back, or its connection ended, or cv forgotten with its
		// ownership since the turn began (Forget), or contained (a
		// damaged value its batch met): nothing settles a slot parked
		// now.
		c.giveBackLocked(slot)
		return
	}
	slot.held = false // its reservation goes on as the parked one
	parked := &bindingSlot{c: c, held: true}
	cv.parked = append(cv.parked, parked)
	if c.parked == nil {
		c.parked = make(map[*bindingSlot]*conversation)
	}
	c.parked[parked] = cv
}

// unparkAll gives back every slot of c parked on a conversation; c has
// ended (End), so none is parked after it. It takes each conversation's
// mu, so c.mu must not be held.
func (c *Conn) unparkAll() {
	c.mu.Lock()
	parked := c.parked
	c.parked = nil
	c.mu.Unlock()
	for slot, cv := range parked {
		cv.mu.Lock()
		if i := slices.Index(cv.parked, slot); i >= 0 {
			cv.parked = slices.Delete(cv.parked, i, i+1)
		}
		cv.mu.Unlock()
		slot.release()
	}
}

// takeParkedLocked removes and returns a slot parked on cv for connection
// c, or nil when none is; cv.mu is held.
//
// +checklocks:cv.mu
func (cv *conversation) takeParkedLocked(c *Conn) *bindingSlot {
	for i, slot := range cv.parked {
		if slot.c == c {
			cv.parked = slices.Delete(cv.parked, i, i+1)
			return slot
		}
	}
	return nil
}

// settleParked gives back every slot parked on cv: a load found every
// binding it had to find (rebindTurn took over the slots of those it
// bound), or cv binds no one any more.
func (cv *conversation) settleParked() {
	cv.mu.Lock()
	parked := cv.parked
	cv.parked = nil
	cv.mu.Unlock()
	releaseAll(parked)
}

// Next returns the next record to push to the participant this connection
// holds bound in conv: the first record addressed to it after
// max(its durable cursor, the last delivery Next returned for this
// binding), in ascending seq, and remembers it as offered. Conn is the
// only owner of that offered cursor: a new binding starts it again at the
// durable cursor, and Status reports it. ok is false when there is none,
// when this connection holds no binding there, while the conversation is
// not reconciled (reconciliation wakes the connection when it is), or
// once the right to serve it may have lapsed (Ownership.Holds; in cluster
// mode a node pushes nothing after its lease's local deadline, and the
// reconciliation of its next claim wakes the connection).
//
// A payload the backlog budget dropped from memory is read back from the
// oplog here, on the caller's goroutine, with no lock held. If that read
// fails (a failing store), Next logs it and reports ok false; the next wake
// of the connection retries.
func (c *Conn) Next(conv ConversationID) (d Delivery, ok bool) {
	cv := c.svc.existing(conv)
	if cv == nil || !c.svc.ownership().Holds(conv) {
		return Delivery{}, false
	}
	// One hold of c.mu, under cv.mu (the lock order), reads the binding
	// and its offered cursor and advances the cursor past d.
	var (
		p       ParticipantID
		source  uint64
		evicted bool
	)
	cv.mu.RLock()
	c.mu.Lock()
	p, bound := c.bindings[conv]
	if bound {
		d, source, evicted, ok = c.nextLocked(cv, p, c.offered[conv])
		if ok && !evicted {
			c.offerLocked(conv, d)
		}
	}
	c.mu.Unlock()
	cv.mu.RUnlock()
	if !ok || !evicted {
		return d, ok
	}
	payload, err := c.svc.readPayload(conv, source, d.Seq)
	if err != nil {
		c.svc.log.Error().Err(err).Uint64("conversation", uint64(conv)).Stringer("seq", d.Seq).
			Msg("reading an evicted payload back from the oplog")
		return Delivery{}, false
	}
	d.Payload = payload
	c.mu.Lock()
	if q, bound := c.bindings[conv]; bound && q == p {
		c.offerLocked(conv, d)
	}
	c.mu.Unlock()
	return d, true
}

// offerLocked remembers d as the last delivery offered to the binding in
// conv. c.mu is held.
//
// +checklocks:c.mu
func (c *Conn) offerLocked(conv ConversationID, d Delivery) {
	if c.offered == nil {
		c.offered = make(map[ConversationID]Offered)
	}
	c.offered[conv] = Offered{Epoch: d.Epoch, Through: d.Seq}
}

// SetOfferedForTest makes Next continue in conv after o, as if o were the
// last delivery offered to the binding there (Offered{}: after the
// durable cursor, as for a new binding), so that a test replays a
// binding's deliveries from a point it chooses. It does nothing when c
// holds no binding in conv. Not for production use: the server never
// rewinds what it offered.
func (c *Conn) SetOfferedForTest(conv ConversationID, o Offered) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, bound := c.bindings[conv]; !bound {
		return
	}
	if c.offered == nil {
		c.offered = make(map[ConversationID]Offered)
	}
	c.offered[conv] = o
}

// nextLocked finds Next's record in cv's state. When its payload was
// evicted, it returns the oplog row to read it from. The caller holds
// cv.mu for reading and c.mu.
//
// +checklocksread:cv.mu
// +checklocks:c.mu
func (c *Conn) nextLocked(cv *conversation, p ParticipantID, offered Offered) (d Delivery, source uint64, evicted, ok bool) {
	st := cv.state
	if st == nil {
		return Delivery{}, 0, false, false
	}
	m := st.Member(p)
	if m == nil || !m.Bound || m.Conn != c.id {
		return Delivery{}, 0, false, false
	}
	epoch := Epoch{Conn: m.Conn, Generation: m.Generation}
	after := m.Cursor
	if offered.Epoch == epoch && offered.Through > after {
		after = offered.Through
	}
	if after < m.Released {
		// Records addressed to p above what it acknowledged or was
		// offered were released unacknowledged: the binding learns it
		// once, before the records that follow.
		return Delivery{Conversation: cv.id, Recipient: p, Seq: m.Released, First: m.Released + 1, Epoch: epoch}, 0, false, true
	}
	rec, ok := st.Next(p, after)
	if !ok {
		return Delivery{}, 0, false, false
	}
	return Delivery{
		Conversation: cv.id,
		Recipient:    p,
		Seq:          rec.Seq,
		Kind:         rec.Kind,
		Participant:  rec.Participant,
		Payload:      rec.Payload(),
		Cause:        rec.Cause,
		Epoch:        epoch,
	}, rec.Source, rec.Evicted, true
}
