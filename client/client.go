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

	// mu guards the fields below. Never held across I/O.
	mu      sync.Mutex
	cur     *session      // the ready session; nil while reconnecting
	readyCh chan struct{} // closed once cur is set
	welcome Welcome
	members map[key]*member
	seen    map[uint64]uint64 // conversation -> highest seq delivered
	closed  bool
}

// member is a participant the client holds.
type member struct {
	// attachMu serializes the attaches of this participant; held across
	// I/O, taken before Client.mu.
	attachMu sync.Mutex

	// Guarded by Client.mu.
	cred      Credential
	wantBound bool          // re-attach after a reconnect
	sess      *session      // the session holding its binding, nil if none
	intent    *attachIntent // an attach sent whose outcome is unknown
	// nextToken, when set, is the token the next new intent uses (Attach
	// with WithToken).
	nextToken *Token
	lost      error  // a *LostError once the participant is lost
	cursor    uint64 // the durable cursor, as last answered
}

// attachIntent is one intended attach: the credential it presents stays
// the same on every retry, and so does its token, but for one renewal:
// a token refused token_expired is replaced once by a fresh one (see
// renewExpiredLocked). Its fields are guarded by Client.mu.
type attachIntent struct {
	token     Token
	presented Credential
	sentOn    map[uint64]bool // session ordinals token was sent on
	// intended marks a token OnIntent accepted; a token is sent only
	// once it is intended.
	intended bool
	// renewed marks an intent whose first token expired and was
	// replaced; a second token_expired loses the participant.
	renewed bool
	// supplied marks a token the caller gave (WithToken): it may have
	// been sent by another process, so a replay marked bound names a
	// binding that is not this client's, and it is never renewed.
	supplied bool
}

// renewExpiredLocked replaces in's token, refused token_expired, with a
// fresh one and reports whether it did: at most once per intent, and
// never for a token the caller supplied, whose meaning is the caller's.
//
// Safe because an attach presents a credential: if an earlier send of
// the expired token committed, the presented generation is no longer the
// current one and the new token's attach is refused stale_authority
// (nothing done; lost, as the minted secret never arrived); if none
// committed, the new token's attach is the first to. It never commits
// twice. The new token has gone out on no session yet, and is sent only
// after OnIntent accepts it. c.mu is held.
func (in *attachIntent) renewExpiredLocked() bool {
	if in.supplied || in.renewed {
		return false
	}
	in.token, in.renewed, in.intended = NewToken(), true, false
	in.sentOn = make(map[uint64]bool)
	return true
}

// Dial connects to addr, runs the handshake and returns a Client that keeps
// a connection until Close. The first connection is made before Dial
// returns: its failure (a refused connection, a *RejectedError such as
// auth_failed) is Dial's error. Later connection losses are repaired in the
// background.
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	opts.withDefaults()
	s, err := dial(ctx, addr, &opts, 1)
	if err != nil {
		return nil, err
	}
	c := &Client{
		addr:    addr,
		opts:    opts,
		log:     opts.Logger.With().Str("component", "client").Str("addr", addr).Logger(),
		out:     make(chan Delivery, opts.DeliveryBuffer),
		readyCh: make(chan struct{}),
		members: make(map[key]*member),
		seen:    make(map[uint64]uint64),
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
// client holds, deduplicated on (conversation, seq), in ascending seq per
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
		err := s.run(c.deliver)
		if c.ctx.Err() == nil {
			c.log.Info().Err(err).Uint64("session", s.seq).Msg("connection ended")
		}
	}()
}

// publish makes s the ready session. The caller has re-attached every
// member that wants a binding.
func (c *Client) publish(s *session) {
	c.cur = s
	c.welcome = s.welcome
	close(c.readyCh)
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
func (c *Client) supervise(s *session) {
	defer c.wg.Done()
	for {
		select {
		case <-s.dead:
		case <-c.ctx.Done():
			c.goodbye(s)
			return
		}
		c.mu.Lock()
		c.unpublishLocked(s)
		c.mu.Unlock()
		if c.ctx.Err() == nil && c.opts.OnDisconnect != nil {
			c.opts.OnDisconnect(s.reason())
		}
		if s = c.reconnect(); s == nil {
			return
		}
		if c.opts.OnReconnect != nil {
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
// binding is re-attached on it, then publishes it. It returns nil after
// Close.
func (c *Client) reconnect() *session {
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	for {
		if !sleep(c.ctx, b.next(), nil) {
			return nil
		}
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

// reattachAll attaches, on s, every member that wants a binding and does not
// hold one there, then publishes s. A member whose attach is refused is
// marked lost and skipped; losing s is an error.
//
// A member whose attach is refused backlog_full (its conversation, or the
// server, retains too many unacknowledged records) does not hold the
// connection hostage: it is deferred, neither lost nor bound, after one
// try, s is published for every other member, and retryAttach keeps
// attaching it on s with the same intent. Retrying it here for BacklogWait
// and then dropping s would end and re-create the bindings of every other
// member, again and again while that conversation stays full.
func (c *Client) reattachAll(s *session) error {
	deferred := make(map[*member]bool)
	for {
		c.mu.Lock()
		var todo []*member
		for _, m := range c.members {
			if m.wantBound && m.lost == nil && m.sess != s && !deferred[m] {
				todo = append(todo, m)
			}
		}
		if len(todo) == 0 {
			c.publish(s)
			var later []*member
			for m := range deferred {
				if c.members[m.cred.key()] == m && m.wantBound && m.lost == nil && m.sess != s {
					later = append(later, m)
				}
			}
			// The supervisor holds a count of wg, so these Adds cannot
			// race Close's Wait at zero.
			c.wg.Add(len(later))
			c.mu.Unlock()
			for _, m := range later {
				go c.retryAttach(s, m)
			}
			return nil
		}
		c.mu.Unlock()
		for _, m := range todo {
			_, err := c.attachOn(c.ctx, s, m, -1)
			switch {
			case errors.Is(err, errLost), c.ctx.Err() != nil:
				return fmt.Errorf("client: re-attach: %w", errLost)
			case errors.Is(err, ErrParticipantLost):
				c.log.Error().Err(err).Msg("participant lost")
				c.lostCallback(m, err)
			case errors.Is(err, ErrMoved):
				// Its conversation is served by another node now: this
				// connection no longer holds it (Cluster attaches it there).
				c.forget(c.credential(m))
			case errors.Is(err, ErrBacklogFull):
				c.log.Warn().Err(err).Stringer("participant", c.credential(m)).
					Msg("re-attach deferred: backlog full")
				deferred[m] = true
			case err != nil:
				// Not committed (unavailable, shutting_down, ...): retry
				// on a new connection rather than serve without it.
				return fmt.Errorf("client: re-attach: %w", err)
			}
		}
	}
}

// retryAttach attaches m on s, whose re-attach reattachAll deferred because
// it was refused backlog_full, with backoff between MinBackoff and
// MaxBackoff and the intent (token, presented credential) of the refused
// attach, until m is attached (by it or by the caller's Attach), lost (a
// permanent refusal: OnLost), moved, no longer held or wanted bound, s
// ends (the next reconnect re-attaches m as usual) or Close. Refusals that
// commit nothing (backlog_full, unavailable, an OnIntent error, ...) are
// retried. Between attempts it does not hold m.attachMu, so a caller's
// Attach of m proceeds (with the same intent). It is owned by c.wg.
func (c *Client) retryAttach(s *session, m *member) {
	defer c.wg.Done()
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	for {
		if !sleep(c.ctx, b.next(), s.dead) {
			return
		}
		c.mu.Lock()
		held := c.members[m.cred.key()] == m
		done := !held || !m.wantBound || m.lost != nil || m.sess == s
		c.mu.Unlock()
		if done {
			return
		}
		cred, err := c.attachOn(c.ctx, s, m, -1)
		switch {
		case err == nil:
			c.log.Info().Stringer("participant", cred).Msg("deferred re-attach done")
			return
		case errors.Is(err, errLost), c.ctx.Err() != nil:
			return
		case errors.Is(err, ErrParticipantLost):
			c.mu.Lock()
			held := c.members[m.cred.key()] == m
			c.mu.Unlock()
			if held { // not a Leave that raced the attach
				c.log.Error().Err(err).Msg("participant lost")
				c.lostCallback(m, err)
			}
			return
		case errors.Is(err, ErrMoved):
			c.forget(c.credential(m))
			return
		case !errors.Is(err, ErrBacklogFull):
			c.log.Warn().Err(err).Stringer("participant", c.credential(m)).Msg("deferred re-attach refused; retrying")
		}
	}
}

// attachOn attaches m on s, retrying in_doubt on s and backlog_full for
// backlogWait (as callOnWait), and returns the new credential. It returns
// errLost if s ends first; a refusal that makes the credential unusable
// marks m lost and returns its *LostError. A refusal that commits nothing
// (backlog_full, unavailable, ...) keeps m's intent: the next attempt
// sends the same token and presented credential. A token_expired refusal
// renews the intent's token once (renewExpiredLocked) and tries again.
func (c *Client) attachOn(ctx context.Context, s *session, m *member, backlogWait time.Duration) (Credential, error) {
	m.attachMu.Lock()
	defer m.attachMu.Unlock()
	for {
		c.mu.Lock()
		if m.lost != nil {
			err := m.lost
			m.nextToken = nil
			c.mu.Unlock()
			return Credential{}, err
		}
		if m.sess == s && s.alive() {
			// Bound here already: a supplied token is not needed, and
			// must not name a later attach.
			cred := m.cred
			m.nextToken = nil
			c.mu.Unlock()
			return cred, nil
		}
		in := m.intent
		if in == nil {
			in = &attachIntent{token: NewToken(), presented: m.cred, sentOn: make(map[uint64]bool)}
			if m.nextToken != nil {
				in.token, in.supplied, m.nextToken = *m.nextToken, true, nil
			}
			m.intent = in
		}
		p, tok, intended := in.presented, in.token, in.intended
		c.mu.Unlock()

		// OnIntent sees every token before its first send: an intent's
		// first, and the one that renewed it.
		if !intended {
			if err := c.intend(Intent{Op: IntentAttach, Conversation: p.Conversation, Presented: p, Token: tok}); err != nil {
				// An intent never sent is in doubt nowhere: drop it. A
				// renewed one is kept with its renewal spent; the next
				// attempt asks OnIntent again.
				c.mu.Lock()
				if m.intent == in && !in.renewed {
					m.intent = nil
				}
				c.mu.Unlock()
				return Credential{}, err
			}
		}
		c.mu.Lock()
		in.intended = true
		in.sentOn[s.seq] = true
		c.mu.Unlock()

		ans, err := c.callOnWait(ctx, s, &wire.Attach{Conversation: p.Conversation, Participant: p.Participant,
			Generation: p.Generation, Secret: p.Secret, Token: tok}, backlogWait)
		if err != nil {
			return Credential{}, err
		}
		switch a := ans.(type) {
		case *wire.Attached:
			c.mu.Lock()
			m.cred.Generation, m.cred.Secret = a.Generation, a.Secret
			m.intent = nil
			m.cursor = max(m.cursor, a.Cursor)
			// A replay marked bound names a binding made by this token;
			// it is this session's only if the token never went out on
			// another one.
			here := a.Replay == nil || (*a.Replay == wire.ReplayBound && len(in.sentOn) == 1 && !in.supplied)
			if here {
				m.sess = s
			} else {
				m.sess = nil
			}
			cred := m.cred
			c.mu.Unlock()
			c.credentialChanged(cred)
			if here {
				return cred, nil
			}
			// The attach committed, but its binding is elsewhere or gone:
			// attach again with the credential it minted.
		case *wire.Error:
			e := fromWire(a)
			if e.Code == CodeTokenExpired {
				c.mu.Lock()
				renewed := m.intent == in && in.renewExpiredLocked()
				c.mu.Unlock()
				if renewed {
					c.log.Info().Stringer("participant", p).Msg("attach token expired; retrying with a new token")
					continue
				}
			}
			switch e.Code {
			case CodeReceiptExpired, CodeStaleAuthority, CodeRetired, CodeUnknownParticipant,
				// Final answers about the intent's token: an invalid
				// one, or one that expired again after its renewal or
				// that the caller supplied, whose earlier sends may
				// have committed (and moved the credential on).
				CodeTokenExpired, CodeTokenInvalid:
				lost := &LostError{Conversation: p.Conversation, Participant: p.Participant, Err: e}
				c.mu.Lock()
				m.lost, m.intent, m.sess = lost, nil, nil
				c.mu.Unlock()
				return Credential{}, lost
			}
			return Credential{}, e
		default:
			return Credential{}, fmt.Errorf("%w: %s answers attach", ErrProtocol, ans.Type())
		}
	}
}

// credential returns m's credential.
func (c *Client) credential(m *member) Credential {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.cred
}

// lostCallback calls OnLost for m, lost with err.
func (c *Client) lostCallback(m *member, err error) {
	if c.opts.OnLost == nil {
		return
	}
	c.mu.Lock()
	cred := m.cred
	c.mu.Unlock()
	c.opts.OnLost(cred, err)
}

// noticeRefusal looks at the refusal e of a request that needed the
// binding of the participant k at generation gen, sent on s. When the
// client believed that binding was on s, the refusal shows it is gone
// (superseded, or the participant left): the participant is marked lost,
// OnLost is called, and the *LostError is returned. Otherwise e is
// returned as is.
func (c *Client) noticeRefusal(s *session, k key, gen uint64, e *Error) error {
	var why error
	switch e.Code {
	case CodeStaleAuthority, CodeNoBinding:
		why = fmt.Errorf("%w: %w", ErrBindingSuperseded, e)
	case CodeRetired, CodeUnknownParticipant:
		why = e
	default:
		return e
	}
	c.mu.Lock()
	m := c.members[k]
	if m == nil || m.lost != nil || m.sess != s || m.intent != nil || m.cred.Generation != gen {
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
			if s != nil && m.sess == s && m.lost == nil && m.intent == nil {
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
// backoff. It sets m's id. Errors: errLost, ctx's error; a backlog_full
// answer is returned as the answer once the wait is over or ctx ends
// (nothing was done, so the outcome is known).
func (c *Client) callOn(ctx context.Context, s *session, m wire.Message) (wire.Message, error) {
	return c.callOnWait(ctx, s, m, c.opts.BacklogWait)
}

// callOnWait is callOn retrying backlog_full for backlogWait instead of
// Options.BacklogWait; a negative backlogWait returns it at once.
func (c *Client) callOnWait(ctx context.Context, s *session, m wire.Message, backlogWait time.Duration) (wire.Message, error) {
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	var fullUntil time.Time
	for {
		id := c.ids.Add(1)
		setID(m, id)
		ans, err := s.call(ctx, id, m)
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

// setID sets the id of request m.
func setID(m wire.Message, id uint64) {
	switch m := m.(type) {
	case *wire.Enroll:
		m.ID = id
	case *wire.Attach:
		m.ID = id
	case *wire.Tell:
		m.ID = id
	case *wire.Ack:
		m.ID = id
	case *wire.Detach:
		m.ID = id
	case *wire.Leave:
		m.ID = id
	case *wire.Ping:
		m.ID = id
	case *wire.Bye:
		m.ID = id
	default:
		panic("client: setID of " + m.Type())
	}
}
