package participant

import (
	"context"
	"crypto/rand"
	"sort"
	"sync"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
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

	// mu guards the fields below.
	mu sync.Mutex
	// ready is the set of conversations with something to publish to this
	// connection; order keeps their arrival order.
	ready map[ConversationID]struct{}
	order []ConversationID
	// bindings maps each conversation this connection is bound in to the
	// participant bound.
	bindings map[ConversationID]ParticipantID
	// ended is set by End; no operation starts after it.
	ended bool
	// inflight counts operations started and not finished.
	inflight sync.WaitGroup
}

// ID returns the connection incarnation.
func (c *Conn) ID() ConnID { return c.id }

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

// Binding names one participant bound on a connection.
type Binding struct {
	Conversation ConversationID
	Participant  ParticipantID
}

func (c *Conn) bind(conv ConversationID, p ParticipantID) {
	c.mu.Lock()
	c.bindings[conv] = p
	c.mu.Unlock()
}

func (c *Conn) unbind(conv ConversationID, p ParticipantID) {
	c.mu.Lock()
	if q, ok := c.bindings[conv]; ok && q == p {
		delete(c.bindings, conv)
	}
	c.mu.Unlock()
}

func (c *Conn) bindingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.bindings)
}

func (c *Conn) isEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// begin starts an operation on conversation id: it takes the
// conversation's turn and makes sure its state is reconciled. create
// admits a conversation that does not exist yet (enroll). The caller must
// call the returned finish.
func (c *Conn) begin(ctx context.Context, id ConversationID, create bool) (*conversation, *outbox.State, func(), error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil, nil, nil, refuse(CodeUnavailable, "the connection has ended")
	}
	c.inflight.Add(1)
	c.mu.Unlock()
	if c.svc.isDraining() {
		c.inflight.Done()
		return nil, nil, nil, refuse(CodeShuttingDown, "the server is draining")
	}
	var cv *conversation
	if create {
		cv = c.svc.conversation(id)
	} else if cv = c.svc.existing(id); cv == nil {
		c.inflight.Done()
		return nil, nil, nil, refuse(CodeUnknownParticipant, "no conversation %v", id)
	}
	if err := cv.acquire(ctx); err != nil {
		c.inflight.Done()
		return nil, nil, nil, err
	}
	st, err := c.svc.ensureLoadedTurn(ctx, cv)
	if err != nil {
		c.svc.release(cv)
		c.inflight.Done()
		return nil, nil, nil, err
	}
	return cv, st, func() { c.svc.release(cv); c.inflight.Done() }, nil
}

func (c *Conn) decider(conv ConversationID) *decider {
	o := &c.svc.opts
	return &decider{
		key:             o.NodeKey,
		conv:            conv,
		conn:            c.id,
		now:             c.svc.now(),
		maxRecordBytes:  o.MaxRecordBytes,
		maxParticipants: o.MaxParticipants,
		connBindings:    c.bindingCount(),
		maxConnBindings: o.MaxConversationsPerConn,
	}
}

func (s *Service) replayer(conv ConversationID) *replayer {
	return &replayer{key: s.opts.NodeKey, conv: conv, now: s.now(), ttl: s.opts.ReceiptTTL}
}

// asError turns a nil *Error into a nil error.
func asError(e *Error) error {
	if e == nil {
		return nil
	}
	return e
}

func unavailable(what string, err error) error {
	return &Error{Code: CodeUnavailable, Detail: what, cause: err}
}

func anyRow(*oplog.Row) bool { return true }

func byParticipant(p ParticipantID) func(*oplog.Row) bool {
	return func(r *oplog.Row) bool { return r.Participant == p }
}

// Enroll creates a participant (and the conversation on first use) and
// binds it to this connection. Errors are *Error.
func (c *Conn) Enroll(ctx context.Context, req Enroll) (b Bound, err error) {
	defer c.svc.observe("enroll", time.Now(), &err, &b.Replay, nil)
	cv, st, finish, err := c.begin(ctx, req.Conversation, true)
	if err != nil {
		return Bound{}, err
	}
	defer finish()
	pr, tw, err := c.svc.lookupToken(cv.id, st.Applied, enrollScope, anyRow, req.Token)
	if err != nil {
		return Bound{}, unavailable("reading the token index", err)
	}
	if pr != nil {
		b, e := c.svc.replayer(cv.id).enroll(st, pr)
		return b, asError(e)
	}
	d := c.decider(cv.id)
	row, e := d.enroll(st, &req)
	if e != nil {
		return Bound{}, e
	}
	o := &op{row: row, tok: &tw, binds: true}
	if st.Applied == 0 {
		g := oplog.Row{Kind: oplog.KindGenesis, At: d.at()}
		if _, err := rand.Read(g.Nonce[:]); err != nil {
			return Bound{}, unavailable("minting the conversation nonce", err)
		}
		o.genesis = &g
		o.row.Seq = 1
	}
	rows, err := c.svc.commit(ctx, cv, o)
	if err != nil {
		return Bound{}, err
	}
	c.svc.published(cv, rows, nil, &o.row)
	return Bound{
		Conversation:     cv.id,
		Participant:      row.Participant,
		Generation:       row.Generation,
		Secret:           deriveSecret(d.key, st.Nonce, cv.id, row.Participant, row.Generation),
		Cursor:           0,
		ReceiptExpiresAt: time.UnixMilli(row.At).Add(c.svc.opts.ReceiptTTL),
	}, nil
}

// Attach presents a credential, mints the next generation and a new secret,
// and binds the participant to this connection, superseding any binding it
// held elsewhere (or here). Errors are *Error.
func (c *Conn) Attach(ctx context.Context, req Attach) (b Bound, err error) {
	defer c.svc.observe("attach", time.Now(), &err, &b.Replay, nil)
	cv, st, finish, err := c.begin(ctx, req.Conversation, false)
	if err != nil {
		return Bound{}, err
	}
	defer finish()
	if st.Member(req.Participant) != nil {
		pr, tw, err := c.svc.lookupToken(cv.id, st.Applied, participantScope(req.Participant), byParticipant(req.Participant), req.Token)
		if err != nil {
			return Bound{}, unavailable("reading the token index", err)
		}
		if pr != nil {
			b, e := c.svc.replayer(cv.id).attach(st, pr, &req)
			return b, asError(e)
		}
		d := c.decider(cv.id)
		row, e := d.attach(st, &req)
		if e != nil {
			return Bound{}, e
		}
		m := st.Member(req.Participant)
		old := m.Conn
		o := &op{row: row, tok: &tw, binds: true}
		if m.Bound {
			o.ending = cv.endingOf(req.Participant)
		}
		rows, err := c.svc.commit(ctx, cv, o)
		if err != nil {
			return Bound{}, err
		}
		c.svc.published(cv, rows, &superseded{conn: old, p: req.Participant, ok: o.ending != nil}, &o.row)
		return Bound{
			Conversation:     cv.id,
			Participant:      row.Participant,
			Generation:       row.Generation,
			Secret:           deriveSecret(d.key, st.Nonce, cv.id, row.Participant, row.Generation),
			Cursor:           row.Cursor,
			ReceiptExpiresAt: time.UnixMilli(row.At).Add(c.svc.opts.ReceiptTTL),
		}, nil
	}
	_, e := member(st, req.Participant)
	return Bound{}, e
}

// Tell appends a record to the conversation. Errors are *Error.
func (c *Conn) Tell(ctx context.Context, req Tell) (t Told, err error) {
	defer c.svc.observe("tell", time.Now(), &err, &t.Replay, nil)
	cv, st, finish, err := c.begin(ctx, req.Conversation, false)
	if err != nil {
		return Told{}, err
	}
	defer finish()
	pr, tw, err := c.lookup(cv, st, req.Participant, req.Token)
	if err != nil {
		return Told{}, err
	}
	if pr != nil {
		t, e := c.svc.replayer(cv.id).tell(pr, &req)
		return t, asError(e)
	}
	row, e := c.decider(cv.id).tell(st, &req)
	if e != nil {
		return Told{}, e
	}
	rows, err := c.svc.commit(ctx, cv, &op{row: row, tok: &tw})
	if err != nil {
		return Told{}, err
	}
	c.svc.published(cv, rows, nil, nil)
	return Told{Conversation: cv.id, Seq: row.Seq}, nil
}

// lookup resolves a participant-scoped token; a participant that does not
// exist has committed nothing.
func (c *Conn) lookup(cv *conversation, st *outbox.State, p ParticipantID, t Token) (*prior, tokenWrite, error) {
	if st.Member(p) == nil {
		return nil, tokenWrite{}, nil
	}
	pr, tw, err := c.svc.lookupToken(cv.id, st.Applied, participantScope(p), byParticipant(p), t)
	if err != nil {
		return nil, tw, unavailable("reading the token index", err)
	}
	return pr, tw, nil
}

// Ack advances the participant's cursor. Errors are *Error.
func (c *Conn) Ack(ctx context.Context, req Ack) (a Acked, err error) {
	defer c.svc.observe("ack", time.Now(), &err, nil, &a.Noop)
	cv, st, finish, err := c.begin(ctx, req.Conversation, false)
	if err != nil {
		return Acked{}, err
	}
	defer finish()
	row, noop, e := c.decider(cv.id).ack(st, &req)
	if e != nil {
		return Acked{}, e
	}
	if noop {
		return Acked{Conversation: cv.id, Participant: req.Participant, Cursor: req.Through, Noop: true}, nil
	}
	if _, err := c.svc.commit(ctx, cv, &op{row: row}); err != nil {
		return Acked{}, err
	}
	return Acked{Conversation: cv.id, Participant: req.Participant, Cursor: row.Through}, nil
}

// Detach ends the participant's binding cleanly. Errors are *Error.
func (c *Conn) Detach(ctx context.Context, req Detach) (d Ended, err error) {
	defer c.svc.observe("detach", time.Now(), &err, &d.Replay, nil)
	cv, st, finish, err := c.begin(ctx, req.Conversation, false)
	if err != nil {
		return Ended{}, err
	}
	defer finish()
	pr, tw, err := c.lookup(cv, st, req.Participant, req.Token)
	if err != nil {
		return Ended{}, err
	}
	if pr != nil {
		d, e := c.svc.replayer(cv.id).ended(pr, oplog.KindDetach)
		return d, asError(e)
	}
	row, e := c.decider(cv.id).detach(st, &req)
	if e != nil {
		return Ended{}, e
	}
	o := &op{row: row, tok: &tw, ending: cv.endingOf(req.Participant)}
	rows, err := c.svc.commit(ctx, cv, o)
	if err != nil {
		return Ended{}, err
	}
	c.svc.published(cv, rows, &superseded{conn: row.Conn, p: req.Participant, ok: true}, nil)
	return Ended{Conversation: cv.id, Participant: req.Participant, Seq: row.Seq}, nil
}

// Leave retires the participant, ending its binding if it has one. Errors
// are *Error.
func (c *Conn) Leave(ctx context.Context, req Leave) (l Ended, err error) {
	defer c.svc.observe("leave", time.Now(), &err, &l.Replay, nil)
	cv, st, finish, err := c.begin(ctx, req.Conversation, false)
	if err != nil {
		return Ended{}, err
	}
	defer finish()
	pr, tw, err := c.lookup(cv, st, req.Participant, req.Token)
	if err != nil {
		return Ended{}, err
	}
	if pr != nil {
		l, e := c.svc.replayer(cv.id).ended(pr, oplog.KindLeave)
		return l, asError(e)
	}
	row, e := c.decider(cv.id).leave(st, &req)
	if e != nil {
		return Ended{}, e
	}
	bound := st.Member(req.Participant).Bound
	o := &op{row: row, tok: &tw}
	if bound {
		o.ending = cv.endingOf(req.Participant)
	}
	rows, err := c.svc.commit(ctx, cv, o)
	if err != nil {
		return Ended{}, err
	}
	c.svc.published(cv, rows, &superseded{conn: row.Conn, p: req.Participant, ok: bound}, nil)
	return Ended{Conversation: cv.id, Participant: req.Participant, Seq: row.Seq}, nil
}

// End ends the connection: it waits for the operations in flight, then ends
// every binding the connection holds with cause (connection_lost or
// protocol_error as `died`; clean or shutdown as `detached`), each through
// the two barriers, and forgets the connection. A binding whose ending
// cannot be committed now (an unloadable conversation, a failing store) ends
// as died/unclean_restart at the next start. End is idempotent.
func (c *Conn) End(ctx context.Context, cause Cause) error {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil
	}
	c.ended = true
	c.mu.Unlock()
	c.inflight.Wait()
	var firstErr error
	// Reconciling one conversation can reveal a binding of this connection
	// in it that a failed commit left (an attach that did commit), so go
	// round until no binding is left that was not tried.
	tried := make(map[ConversationID]bool)
	for more := true; more; {
		more = false
		for _, b := range c.Bindings() {
			if tried[b.Conversation] {
				continue
			}
			tried[b.Conversation], more = true, true
			if err := c.svc.endBinding(ctx, b.Conversation, b.Participant, c.id, cause); err != nil && firstErr == nil {
				firstErr = err
			}
		}
	}
	c.svc.mu.Lock()
	delete(c.svc.conns, c.id)
	c.svc.mu.Unlock()
	return firstErr
}

// endBinding commits the end of p's binding on conn in conversation id, if
// it still holds it.
func (s *Service) endBinding(ctx context.Context, id ConversationID, p ParticipantID, conn ConnID, cause Cause) (err error) {
	defer s.observe("end", time.Now(), &err, nil, nil)
	cv := s.existing(id)
	if cv == nil {
		return nil
	}
	if err := cv.acquire(ctx); err != nil {
		return err
	}
	defer s.release(cv)
	st, err := s.ensureLoadedTurn(ctx, cv)
	if err != nil {
		return err
	}
	return s.endLoadedTurn(ctx, cv, st, p, conn, cause)
}

// endLoadedTurn commits the end of p's binding on conn; the caller holds
// cv's turn and st is its loaded state.
func (s *Service) endLoadedTurn(ctx context.Context, cv *conversation, st *outbox.State, p ParticipantID, conn ConnID, cause Cause) error {
	row, ok := end(st, p, conn, cause, s.now())
	if !ok {
		return nil
	}
	o := &op{row: row, ending: cv.endingOf(p)}
	rows, err := s.commit(ctx, cv, o)
	if err != nil {
		return err
	}
	s.published(cv, rows, &superseded{conn: conn, p: p, ok: true}, nil)
	return nil
}

// endingOf returns the ending of p's current binding. Turn holder only.
func (cv *conversation) endingOf(p ParticipantID) *ending {
	cv.mu.RLock()
	defer cv.mu.RUnlock()
	return &ending{site: site{cv.id, p}, token: cv.bindingTokens[p]}
}

// superseded names a binding a commit ended.
type superseded struct {
	conn ConnID
	p    ParticipantID
	ok   bool
}

// published runs after a successful commit: it moves binding bookkeeping
// from the ended binding's connection to the new binding's, and wakes every
// connection with something new to publish: the bound recipients of the new
// records, and a new binding with records after its cursor.
func (s *Service) published(cv *conversation, rows []outbox.Row, ended *superseded, bound *oplog.Row) {
	if ended != nil && ended.ok {
		if c := s.conn(ended.conn); c != nil {
			c.unbind(cv.id, ended.p)
		}
	}
	if bound != nil {
		if c := s.conn(bound.Conn); c != nil {
			c.bind(cv.id, bound.Participant)
		}
	}
	var wake []ConnID
	cv.mu.RLock()
	st := cv.state
	for _, row := range rows {
		for _, rec := range row.Records {
			for _, r := range rec.Recipients {
				if m := &st.Members[r]; m.Bound {
					wake = append(wake, m.Conn)
				}
			}
		}
	}
	if bound != nil {
		if m := st.Member(bound.Participant); m.Bound && st.Next(bound.Participant, m.Cursor) != nil {
			wake = append(wake, m.Conn)
		}
	}
	cv.mu.RUnlock()
	for _, id := range wake {
		if c := s.conn(id); c != nil {
			c.markReady(cv.id)
		}
	}
}

// Next returns the next record to push to the participant this connection
// holds bound in conv: the first record addressed to it after
// max(its durable cursor, offered.Through if offered is of this binding),
// in ascending seq. ok is false when there is none, when this connection
// holds no binding there, or while the conversation is not reconciled
// (reconciliation wakes the connection when it is).
func (c *Conn) Next(conv ConversationID, offered Offered) (d Delivery, ok bool) {
	cv := c.svc.existing(conv)
	if cv == nil {
		return Delivery{}, false
	}
	c.mu.Lock()
	p, bound := c.bindings[conv]
	c.mu.Unlock()
	if !bound {
		return Delivery{}, false
	}
	cv.mu.RLock()
	defer cv.mu.RUnlock()
	st := cv.state
	if st == nil {
		return Delivery{}, false
	}
	m := st.Member(p)
	if m == nil || !m.Bound || m.Conn != c.id {
		return Delivery{}, false
	}
	epoch := Epoch{Conn: m.Conn, Generation: m.Generation}
	after := m.Cursor
	if offered.Epoch == epoch && offered.Through > after {
		after = offered.Through
	}
	rec := st.Next(p, after)
	if rec == nil {
		return Delivery{}, false
	}
	return Delivery{
		Conversation: conv,
		Recipient:    p,
		Seq:          rec.Seq,
		Kind:         rec.Kind,
		Participant:  rec.Participant,
		Payload:      rec.Payload,
		Cause:        rec.Cause,
		Epoch:        epoch,
	}, true
}
