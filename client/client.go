package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/wire"
	"github.com/rs/zerolog"
)

// Client is a connection to participantd that survives the connection: it
// reconnects, re-attaches its participants and retries operations whose
// outcome it did not learn. It is safe for concurrent use; calls are
// pipelined on the connection.
type Client struct {
	addr string
	opts Options
	log  zerolog.Logger

	ids      atomic.Uint64 // request ids, unique for the client's life
	sessions atomic.Uint64 // session ordinals

	// ctx is the lifetime context of the supervisor, cancelled by Close.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	queue queue
	out   chan Delivery

	// demand wakes the supervisor, idle after bye{idle}, when a call needs
	// a session: sent (without blocking) under mu while cur is nil, and
	// emptied under mu when a session is published.
	demand chan struct{}

	// mu guards the fields below. Never held across I/O.
	mu      sync.Mutex
	cur     *session      // the ready session; nil while reconnecting
	readyCh chan struct{} // closed once cur is set
	welcome Welcome
	members map[key]*member
	handed  handedOn // deliveries queued, to drop repeats
	closed  bool

	// intents is the attach in doubt of each participant: the Client's
	// own, or its Cluster's, shared by all of the Cluster's Clients.
	intents *intents
	// unbound, set by a Cluster, is told (without locks held) of each
	// participant that wants a binding and that this Client no longer
	// holds bound and will not bind again by itself on this node: its
	// connection ended, or its conversation moved. The Cluster follows
	// it to the conversation's owner.
	unbound func(Credential)
	// bound, set by a Cluster, is told (without locks held) of each
	// participant this Client bound on its connection, whoever asked: a
	// re-attachment it made by itself (after a reconnect, a deferred one,
	// one that settles an attach in doubt) moves the server's binding to
	// this node as much as the Cluster's own attaches do, and the Cluster
	// must know where the binding is to follow it once it ends.
	bound func(*Client, Credential)
}

// member is a participant the client holds.
type member struct {
	// attachMu serializes the attaches of this participant: a one-slot
	// semaphore (a send takes it, a receive gives it back), so that a
	// call waiting for an attach in flight gives up with its context.
	// Held across I/O, taken before Client.mu.
	attachMu chan struct{}

	// Guarded by Client.mu.
	cred      Credential
	wantBound bool     // re-attach after a reconnect
	sess      *session // the session holding its binding, nil if none
	// nextToken, when set, is the token of the next new intent (Attach
	// with WithToken), consumed by the next attempt.
	nextToken *Token
	lost      error  // a *LostError once the participant is lost
	lostTold  bool   // OnLost was called for lost
	cursor    uint64 // the durable cursor, as last answered
	// leaving marks a participant a Leave of this client is retiring: a
	// retired refusal is then that leave's doing, not a loss.
	leaving bool
	// settling counts the Leaves of a released participant that send its
	// attach in doubt again (settleAttach): attachOn sends it anyway.
	settling int
}

func newMember(cred Credential) *member {
	return &member{cred: cred, attachMu: make(chan struct{}, 1)}
}

// Dial connects to addr, runs the handshake and returns a Client that keeps
// a connection until Close. The first connection is made before Dial
// returns: its failure (a refused connection, a *RejectedError such as
// auth_failed) is Dial's error; a handshake without a welcome before
// DialTimeout or ctx's deadline says the address is likely not the
// protocol listener (the health listener answers nothing to hello) and
// unwraps to os.ErrDeadlineExceeded. Later connection losses are repaired
// in the background.
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	opts.withDefaults()
	return dialClient(ctx, addr, opts, newIntents(), nil, nil)
}

// dialClient is Dial with the intents table to use and the unbound and
// bound hooks (all a Cluster's). opts has its defaults.
func dialClient(ctx context.Context, addr string, opts Options, in *intents, unbound func(Credential), bound func(*Client, Credential)) (*Client, error) {
	s, err := dial(ctx, addr, &opts, 1)
	if err != nil {
		return nil, err
	}
	c := &Client{
		intents: in,
		unbound: unbound,
		bound:   bound,
		addr:    addr,
		opts:    opts,
		log:     opts.Logger.With().Str("component", "client").Str("addr", addr).Logger(),
		out:     make(chan Delivery, opts.DeliveryBuffer),
		readyCh: make(chan struct{}),
		demand:  make(chan struct{}, 1),
		members: make(map[key]*member),
		handed:  newHandedOn(),
	}
	c.queue.wake = make(chan struct{}, 1)
	c.queue.slots = make(chan struct{}, opts.MaxQueuedDeliveries)
	c.sessions.Store(1)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.startReader(s)
	c.publish(s)
	c.wg.Add(2)
	go c.supervise(s)
	go c.pump()
	if opts.BindingCheckInterval > 0 {
		c.wg.Add(1)
		go c.checkBindings()
	}
	return c, nil
}

// Welcome returns what the server announced on the latest connection.
func (c *Client) Welcome() Welcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.welcome
}

// Deliveries returns the channel of deliveries to the participants this
// client holds, deduplicated on (conversation, recipient, seq), in ascending seq per
// conversation. It is closed by Close.
func (c *Client) Deliveries() <-chan Delivery { return c.out }

// Credential returns the latest credential the client holds for the
// participant, and whether it holds it.
func (c *Client) Credential(conversation, participant uint64) (Credential, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.members[key{conversation, participant}]
	if !ok {
		return Credential{}, false
	}
	return m.cred, true
}

// Close sends bye (the server ends this client's bindings as detached/clean),
// closes the connection, stops every goroutine of the client and waits for
// them. Calls in progress return ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}

func (c *Client) startReader(s *session) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := s.run(c.deliver, c.compacted)
		switch {
		case c.ctx.Err() != nil:
		case errors.Is(err, errIdle):
			c.log.Debug().Uint64("session", s.seq).Msg("idle connection closed by the server")
		default:
			c.log.Info().Err(err).Uint64("session", s.seq).Msg("connection ended")
		}
	}()
}

// publish makes s the ready session. The caller has re-attached every
// member that wants a binding; c.mu is held, or no other goroutine runs
// yet.
func (c *Client) publish(s *session) {
	c.cur = s
	c.welcome = s.welcome
	close(c.readyCh)
	select {
	case <-c.demand: // served by s
	default:
	}
}

// unpublishLocked forgets s as the ready session. c.mu is held.
func (c *Client) unpublishLocked(s *session) {
	if c.cur == s {
		c.cur = nil
		c.readyCh = make(chan struct{})
	}
}

// ready returns the ready session, waiting for a reconnection if needed.
func (c *Client) ready(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		s, ch := c.cur, c.readyCh
		if s != nil && !s.alive() {
			c.unpublishLocked(s)
			s, ch = nil, c.readyCh
		}
		if s == nil {
			select {
			case c.demand <- struct{}{}:
			default: // already asked
			}
		}
		c.mu.Unlock()
		if s != nil {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// supervise owns the connection: it waits for the session to end and
// replaces it, until Close.
//
// A session the server closed for idleness (bye{idle}) ended normally: it
// held no binding, so nothing is reported (no OnDisconnect, no
// OnReconnect) and the next session is dialed at once, without backoff,
// when a participant wants a binding or as soon as a call needs one.
func (c *Client) supervise(s *session) {
	defer c.wg.Done()
	for {
		select {
		case <-s.dead:
		case <-c.ctx.Done():
			c.goodbye(s)
			return
		}
		idle := errors.Is(s.reason(), errIdle)
		c.mu.Lock()
		c.unpublishLocked(s)
		// Every binding of s ended with it. attachOn binds a member on s
		// only while s is alive, under c.mu, so none is missed here.
		var gone []Credential
		wanted := false
		for _, m := range c.members {
			if m.wantBound && m.lost == nil {
				wanted = true
				if m.sess == s {
					gone = append(gone, m.cred)
				}
			}
		}
		c.mu.Unlock()
		if c.ctx.Err() == nil && c.opts.OnDisconnect != nil && !idle {
			c.opts.OnDisconnect(s.reason())
		}
		if c.ctx.Err() == nil {
			c.unboundAll(gone...)
		}
		if idle && !wanted {
			select {
			case <-c.demand:
			case <-c.ctx.Done():
				return
			}
		}
		if s = c.reconnect(!idle); s == nil {
			return
		}
		if c.opts.OnReconnect != nil && !idle {
			c.opts.OnReconnect(s.welcome)
		}
	}
}

// goodbye sends bye, best effort, and ends s.
func (c *Client) goodbye(s *session) {
	if s.alive() {
		_ = s.wc.NetConn().SetWriteDeadline(time.Now().Add(time.Second))
		_ = s.wc.WriteMessage(&wire.Bye{ID: c.ids.Add(1)})
	}
	s.end(ErrClosed)
}

// reconnect dials until a session is up and every member that wants a
// binding is re-attached on it, then publishes it, backing off before
// every attempt, or every attempt but the first when backOff is false. It
// returns nil after Close.
func (c *Client) reconnect(backOff bool) *session {
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	for {
		if backOff && !sleep(c.ctx, b.next(), nil) {
			return nil
		}
		backOff = true
		seq := c.sessions.Add(1)
		s, err := dial(c.ctx, c.addr, &c.opts, seq)
		if err != nil {
			if c.ctx.Err() != nil {
				return nil
			}
			c.log.Warn().Err(err).Msg("reconnect failed")
			continue
		}
		c.startReader(s)
		if err := c.reattachAll(s); err != nil {
			s.end(err)
			if c.ctx.Err() != nil {
				return nil
			}
			c.log.Warn().Err(err).Msg("re-attach failed; reconnecting")
			continue
		}
		c.log.Info().Uint64("incarnation", s.welcome.Incarnation).Uint64("connection", s.welcome.Connection).
			Msg("reconnected")
		return s
	}
}

// credential returns m's credential.
func (c *Client) credential(m *member) Credential {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.cred
}

// lostCallback calls OnLost for m, lost with err, once per loss: the
// goroutines that may find it lost (a re-attachment, a deferred one, a
// call's refusal or its settling of an attach in doubt) may race.
func (c *Client) lostCallback(m *member, err error) {
	if c.opts.OnLost == nil {
		return
	}
	c.mu.Lock()
	cred, told := m.cred, m.lostTold
	m.lostTold = true
	c.mu.Unlock()
	if !told {
		c.opts.OnLost(cred, err)
	}
}

// noticeRefusal looks at the refusal e of a request that needed the
// binding of the participant k at generation gen, sent on s. When the
// client believed that binding was on s, the refusal shows it is gone:
//
//   - moved: this node no longer serves the conversation. The participant
//     is no longer bound here; a Cluster follows it to the new owner (a
//     plain Client re-attaches it on its next connection, which forgets
//     it if the conversation is still elsewhere). e is returned.
//   - no_binding at the current generation, for a Cluster's Client: the
//     node ended the binding without a newer attach (its conversation
//     moved away and back); the Cluster attaches it again. e is returned.
//   - otherwise (superseded, or the participant left) the participant is
//     marked lost, OnLost is called, and the *LostError is returned.
//
// Any other e is returned as is.
func (c *Client) noticeRefusal(s *session, k key, gen uint64, e *Error) error {
	var why error
	switch e.Code {
	case CodeMoved:
		c.noticeUnbound(s, k, gen)
		return e
	case CodeNoBinding:
		if c.unbound != nil {
			c.noticeUnbound(s, k, gen)
			return e
		}
		why = fmt.Errorf("%w: %w", ErrBindingSuperseded, e)
	case CodeStaleAuthority:
		why = fmt.Errorf("%w: %w", ErrBindingSuperseded, e)
	case CodeRetired, CodeUnknownParticipant:
		why = e
	default:
		return e
	}
	if n, ok := c.intents.newestOf(k); ok && n.Generation > gen && e.Code != CodeRetired {
		// An attach of this client, or of another of its Cluster's,
		// moved the participant on: the refusal is its own doing.
		return e
	}
	c.mu.Lock()
	m := c.members[k]
	if m == nil || m.lost != nil || m.sess != s || c.intents.inDoubt(k) || m.cred.Generation != gen ||
		(m.leaving && e.Code == CodeRetired) {
		c.mu.Unlock()
		return e
	}
	lost := &LostError{Conversation: k.conv, Participant: k.participant, Err: why}
	m.lost, m.wantBound, m.sess = lost, false, nil
	c.mu.Unlock()
	c.log.Warn().Err(lost).Msg("participant lost")
	c.lostCallback(m, lost)
	return lost
}

// noticeUnbound records that the participant k, believed bound on s at
// generation gen, is not bound there any more, and tells the Cluster.
func (c *Client) noticeUnbound(s *session, k key, gen uint64) {
	c.mu.Lock()
	m := c.members[k]
	if m == nil || m.lost != nil || m.sess != s || m.cred.Generation != gen {
		c.mu.Unlock()
		return
	}
	m.sess = nil
	cred := m.cred
	c.mu.Unlock()
	c.log.Info().Stringer("participant", cred).Msg("binding gone from this node")
	c.unboundAll(cred)
}

// unboundAll tells the Cluster, if any, that the participants of creds
// are not bound by this Client any more.
func (c *Client) unboundAll(creds ...Credential) {
	if c.unbound == nil {
		return
	}
	for _, cred := range creds {
		c.unbound(cred)
	}
}

// checkBindings probes, every BindingCheckInterval, the binding of each
// participant held bound on the ready connection with an ack at its
// cursor, which changes nothing when the binding is there and is refused
// when it is not, until Close.
func (c *Client) checkBindings() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.BindingCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.ctx.Done():
			return
		}
		type probe struct {
			k           key
			gen, cursor uint64
		}
		c.mu.Lock()
		s := c.cur
		var probes []probe
		for k, m := range c.members {
			if s != nil && m.sess == s && m.lost == nil && !c.intents.inDoubt(k) {
				probes = append(probes, probe{k, m.cred.Generation, m.cursor})
			}
		}
		c.mu.Unlock()
		for _, p := range probes {
			ans, err := c.callOn(c.ctx, s, &wire.Ack{Conversation: p.k.conv, Participant: p.k.participant,
				Generation: p.gen, Through: p.cursor})
			if err != nil {
				break // the connection ended, or Close: the supervisor acts
			}
			switch a := ans.(type) {
			case *wire.Acked:
				c.advanceCursor(p.k, a.Cursor)
			case *wire.Error:
				e := fromWire(a)
				if e.Cursor != nil {
					c.advanceCursor(p.k, *e.Cursor)
				}
				c.noticeRefusal(s, p.k, p.gen, e)
			}
		}
	}
}

// advanceCursor records that the durable cursor of k is at least cursor.
func (c *Client) advanceCursor(k key, cursor uint64) {
	c.mu.Lock()
	if m := c.members[k]; m != nil {
		m.cursor = max(m.cursor, cursor)
	}
	c.mu.Unlock()
}

func (c *Client) credentialChanged(cred Credential) {
	if c.opts.OnCredential != nil {
		c.opts.OnCredential(cred)
	}
}

// callOn sends request m on s and returns its answer, retrying an in_doubt
// answer on s (with a new id, the same body) until the outcome is known,
// and a backlog_full answer for up to Options.BacklogWait: both with
// backoff. It sets m's id. Errors: errLost, ctx's error, a too_large
// *Error for a frame over max_frame (nothing sent); a backlog_full
// answer is returned as the answer once the wait is over or ctx ends
// (nothing was done, so the outcome is known).
func (c *Client) callOn(ctx context.Context, s *session, m wire.Request) (wire.Message, error) {
	return c.callOnWait(ctx, s, m, c.opts.BacklogWait, nil)
}

// callOnWait is callOn retrying backlog_full for backlogWait instead of
// Options.BacklogWait; a negative backlogWait returns it at once. st, if
// not nil, records what each send may have done (sendState.sent).
func (c *Client) callOnWait(ctx context.Context, s *session, m wire.Request, backlogWait time.Duration, st *sendState) (wire.Message, error) {
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	var fullUntil time.Time
	for {
		id := c.ids.Add(1)
		m.SetID(id)
		ans, wrote, err := s.call(ctx, id, m)
		st.sent(wrote, ans)
		if err != nil {
			return nil, err
		}
		e, ok := ans.(*wire.Error)
		switch {
		case ok && e.Code == wire.CodeInDoubt:
			if !sleep(ctx, b.next(), s.dead) {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, errLost
			}
			continue
		case ok && e.Code == wire.CodeBacklogFull:
			if backlogWait < 0 {
				return ans, nil
			}
			if fullUntil.IsZero() {
				fullUntil = time.Now().Add(backlogWait)
			}
			d := b.next()
			if time.Until(fullUntil) < d {
				return ans, nil
			}
			if !sleep(ctx, d, s.dead) {
				if ctx.Err() != nil {
					return ans, nil
				}
				return nil, errLost
			}
			continue
		}
		return ans, nil
	}
}

// sendState is what the sends of one call's token may have done: maybe
// is set once a request carrying the token may have been applied and no
// answer since proved that it was not. A call that ends without an
// answer (its context, Close) is in_doubt only when maybe is set
// (unknown). A Client's call records each send (sent); a Cluster's
// operation each node's outcome (answered).
type sendState struct{ maybe bool }

// sent records one send: whether any of it was written, and its answer
// (nil when none came): none after a write may mean applied; an error
// answer is recorded by refused. A nil st records nothing.
func (st *sendState) sent(wrote bool, ans wire.Message) {
	if st == nil {
		return
	}
	switch a := ans.(type) {
	case nil:
		st.maybe = st.maybe || wrote
	case *wire.Error:
		st.refused(a.Code)
	}
}

// answered records the outcome err of one attempt of a Cluster's
// operation (nil: success): a node's Client's *Error is recorded by
// refused, and no_binding (errRebind) proves that none was applied.
func (st *sendState) answered(err error) {
	if errors.Is(err, errRebind) {
		st.maybe = false
		return
	}
	if e, ok := err.(*Error); ok {
		st.refused(e.Code)
	}
}

// refused records a refusal of code: in_doubt may mean applied; an answer
// the server gives only after it looked the token up and found it not
// committed (settles) proves that no send of it was applied; moved,
// unavailable, shutting_down and the like say only that this send was
// not, and leave maybe as it was.
func (st *sendState) refused(code Code) {
	switch {
	case code == CodeInDoubt:
		st.maybe = true
	case settles(code):
		st.maybe = false
	}
}

// unknown turns the error that ended a call without its outcome into the
// caller's error: an in_doubt *Error carrying tok, wrapping err, when a
// request carrying tok may have been applied (maybe), else err.
func (st *sendState) unknown(tok *Token, err error) error {
	if !st.maybe || tok == nil {
		return err
	}
	return &Error{Code: CodeInDoubt, Detail: "outcome unknown: " + err.Error(), Token: *tok, err: err}
}

// settles reports whether an error answer of code comes after the
// server's token check (docs/PROTOCOL.md, Order of checks) and so proves
// that the request's token was not committed. moved, unavailable,
// shutting_down, invite_*, token_expired, token_invalid and retired (a
// deleted conversation refuses a committed token's replay too) do not,
// nor does receipt_expired, which is given only for a token that did
// commit (its answer's secret is no longer replayed).
func settles(code wire.Code) bool {
	switch code {
	case wire.CodeUnknownParticipant, wire.CodeStaleAuthority, wire.CodeNoBinding,
		wire.CodeBindingOccupied, wire.CodeTokenConflict, wire.CodeTooLarge,
		wire.CodeCapacityExceeded, wire.CodeBacklogFull, wire.CodeRateLimited,
		wire.CodeAckGap, wire.CodeAckRegression:
		return true
	}
	return false
}

// backoff is exponential backoff with jitter: each delay is drawn from the
// upper half of the current step.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

// sleep waits d; it returns false if ctx ends or stop closes first.
func sleep(ctx context.Context, d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
