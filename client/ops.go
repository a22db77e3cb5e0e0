package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/participantd/participantd/wire"
)

// CallOption adjusts one call.
type CallOption func(*callOptions)

type callOptions struct {
	token    Token
	hasToken bool
	invite   []byte
}

// WithToken makes the call use token t instead of a fresh one: pass the
// Token of an in_doubt *Error, or of a persisted Intent, to learn the
// outcome of that operation without applying it twice. Ignored by Ack and
// Ping, which carry no token. t is sent as is even to a server that
// announces a token window (Welcome.TokenWindow) and t is not a UUIDv7:
// the server replays a committed token before it checks the window, so
// such a token may still learn an outcome.
func WithToken(t Token) CallOption {
	return func(o *callOptions) { o.token, o.hasToken = t, true }
}

// WithInvite makes an Enroll carry invitation invite, which a server run
// with --enroll-policy invite requires (else the enroll is refused with
// ErrInviteRequired, or ErrInviteInvalid for a wrong or expired one). Get
// it from the text participantctl invite prints with ParseInvite. Ignored
// by every call but Enroll.
func WithInvite(invite []byte) CallOption {
	return func(o *callOptions) { o.invite = invite }
}

// ParseInvite returns the invitation whose text form (unpadded base64url,
// as participantctl invite prints it) is s. Only the encoding is checked
// here; the server verifies the rest.
func ParseInvite(s string) ([]byte, error) {
	inv, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil || len(inv) == 0 || len(inv) > wire.MaxInvite {
		return nil, fmt.Errorf("client: %q is not an invitation", s)
	}
	return inv, nil
}

func inviteOf(opts []CallOption) []byte {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	return o.invite
}

func callOptionsOf(opts []CallOption) callOptions {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

func tokenOf(opts []CallOption) Token {
	if o := callOptionsOf(opts); o.hasToken && !o.token.IsZero() {
		return o.token
	}
	return NewToken()
}

// do sends the request build makes on the ready session and returns its
// answer and the session it came on. build makes the request without its
// id and runs before every attempt on a new connection, so it
// reads the latest credential; it may refuse with an error. An in_doubt
// answer is retried on the same session, a lost connection (when retry is
// set) on the next one once it is ready. When the call ends without an
// answer (ctx, Close, build's refusal) after a token-bearing request may
// have been applied (sendState), the error is an in_doubt *Error
// carrying the token; when none may have, it is the error itself.
func (c *Client) do(ctx context.Context, tok *Token, retry bool, build func(s *session) (wire.Request, error)) (wire.Message, *session, error) {
	var st sendState
	for {
		s, err := c.ready(ctx)
		if err != nil {
			return nil, nil, st.unknown(tok, err)
		}
		m, err := build(s)
		if err != nil {
			return nil, nil, st.unknown(tok, err)
		}
		ans, err := c.callOnWait(ctx, s, m, c.opts.BacklogWait, &st)
		switch {
		case errors.Is(err, errLost):
			if !retry {
				return nil, nil, ErrConnectionLost
			}
			continue
		case err != nil:
			return nil, nil, st.unknown(tok, err)
		}
		if e, ok := ans.(*wire.Error); ok && st.maybe && tok != nil && !settles(e.Code) {
			// "Not done by this send" (unavailable, moved, ...), after an
			// earlier send that may have been applied: in doubt.
			return nil, nil, st.unknown(tok, fromWire(e))
		}
		return ans, s, nil
	}
}

// member returns the member for cred, creating it when register is set.
func (c *Client) member(cred Credential, register bool) *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[cred.key()]
	if m == nil && register {
		m = newMember(cred)
		c.members[cred.key()] = m
	}
	return m
}

// current returns the latest credential held for cred's participant (cred
// itself when the client does not hold it), or the participant's
// *LostError.
func (c *Client) current(cred Credential) (Credential, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[cred.key()]
	if m == nil {
		return cred, nil
	}
	if m.lost != nil {
		return m.cred, m.lost
	}
	return m.cred, nil
}

// Enroll creates a participant in conversation conv (and the conversation on
// first use), binds it to this client and returns its credential. The client
// then holds the participant: it re-attaches it after a reconnect, which
// changes the credential (see Credential and Options.OnCredential).
//
// Errors are *Error (capacity_exceeded, binding_occupied, invite_required,
// invite_invalid, unavailable, shutting_down, token_expired and
// token_invalid from a server running a token window, which are final: see
// CodeTokenExpired, ...), an in_doubt *Error carrying the token when ctx ended
// before the outcome was known, or ErrClosed.
func (c *Client) Enroll(ctx context.Context, conv uint64, opts ...CallOption) (Credential, error) {
	tok, invite := tokenOf(opts), inviteOf(opts)
	if err := c.intend(Intent{Op: IntentEnroll, Conversation: conv, Token: tok}); err != nil {
		return Credential{}, err
	}
	sentOn := make(map[uint64]bool)
	ans, s, err := c.do(ctx, &tok, true, func(s *session) (wire.Request, error) {
		sentOn[s.seq] = true
		return &wire.Enroll{Conversation: conv, Token: tok, Invite: invite}, nil
	})
	if err != nil {
		return Credential{}, err
	}
	switch a := ans.(type) {
	case *wire.Enrolled:
		cred := Credential{Conversation: a.Conversation, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret}
		// A bound replay names this call's binding only if the token went
		// out once, by this call: a token the caller supplied may have been
		// sent by an earlier process.
		here := a.Replay == nil || (*a.Replay == wire.ReplayBound && len(sentOn) == 1 && !callOptionsOf(opts).hasToken)
		c.mu.Lock()
		m := c.members[cred.key()]
		if m == nil {
			m = newMember(cred)
			c.members[cred.key()] = m
		}
		m.wantBound = true
		m.cursor = max(m.cursor, a.Cursor)
		if here && c.cur == s && s.alive() && !c.intents.inDoubt(cred.key()) && m.cred.Generation == cred.Generation {
			m.sess = s
		}
		bound := m.sess == s && s.alive()
		c.mu.Unlock()
		c.intents.learn(cred)
		c.credentialChanged(cred)
		if bound {
			return cred, nil
		}
		// The enrollment committed but its binding is not on the ready
		// connection: attach, presenting the credential it minted.
		return c.attach(ctx, m)
	case *wire.Error:
		return Credential{}, fromWire(a)
	default:
		return Credential{}, fmt.Errorf("%w: %s answers enroll", ErrProtocol, ans.Type())
	}
}

// Attach presents cred, mints the next generation and a new secret, binds
// the participant to this client and returns the new credential. The client
// then holds the participant as for Enroll. If the client already holds it,
// the credential it holds (the latest) is presented instead of cred, and a
// participant already bound on the current connection is returned as is.
//
// An attach whose answer was lost is retried with the same token and the
// same presented credential. WithToken replays an attach sent before (by
// this or an earlier process, see Intent): with cred as it presented, the
// answer is the original one, and the client then attaches again with the
// credential it minted, since that binding is not this client's. It is
// used only when no attach of the participant is in doubt in this client.
// For a participant the client lost (OnLost), a cred of a newer generation
// than the one it held (the credential the session that took it over
// saved) replaces it and takes it up again. For a participant whose
// re-attachment after a reconnect is deferred (backlog_full), Attach tries
// at once with the deferred attach's token, retrying backlog_full for
// BacklogWait as any attach.
//
// An attach refused token_expired (a server running a token window, and
// an attach retried for longer than the window) is retried once with a new
// token, which OnIntent sees first, and the same presented credential; not
// one whose token came from WithToken (see CodeTokenExpired).
//
// Errors: a *LostError (errors.Is ErrParticipantLost, and
// ErrStaleAuthority, ErrReceiptExpired, ErrRetired,
// ErrUnknownParticipant, or, from a server running a token window,
// ErrTokenExpired (for a WithToken token, or a renewed token that expired
// again) or ErrTokenInvalid for the attach's token) when the
// credential cannot be used, other *Error
// refusals, the error of Options.OnIntent, ErrClosed, or an error saying
// that a Detach or Leave of the participant, called meanwhile, released
// it before the attach was sent.
func (c *Client) Attach(ctx context.Context, cred Credential, opts ...CallOption) (Credential, error) {
	m := c.member(cred, true)
	c.mu.Lock()
	if m.lost != nil && cred.Generation > m.cred.Generation {
		m.cred, m.lost, m.lostTold, m.sess = cred, nil, false, nil
	}
	m.wantBound = true
	if o := callOptionsOf(opts); o.hasToken && !o.token.IsZero() && !c.intents.inDoubt(cred.key()) {
		t := o.token
		m.nextToken = &t
	}
	c.mu.Unlock()
	return c.attach(ctx, m)
}

func (c *Client) attach(ctx context.Context, m *member) (Credential, error) {
	for {
		s, err := c.ready(ctx)
		if err != nil {
			return Credential{}, err
		}
		cred, err := c.attachOn(ctx, s, m, c.opts.BacklogWait)
		if errors.Is(err, errLost) {
			continue
		}
		return cred, err
	}
}

// Tell appends payload to the participant's conversation and returns the
// record's seq. cred names the participant; the client uses the latest
// credential it holds for it. The participant must be bound on this client
// (Enroll or Attach), else the server answers no_binding: so is a
// participant whose re-attachment after a reconnect is deferred because
// its conversation's backlog is full (see the package documentation).
// A tell refused stale_authority because an attach of the client's own
// moved the participant on (one in flight, a deferred re-attachment say,
// or one in doubt) is sent again, with its token, once that attach ended
// or was settled (staleByUs); stale_authority is returned only when no
// attach of the client's explains it.
//
// Errors: *Error (too_large, no_binding, stale_authority, token_conflict,
// token_expired, token_invalid, ...), an in_doubt *Error with the token, a
// *LostError, or ErrClosed.
func (c *Client) Tell(ctx context.Context, cred Credential, payload []byte, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	if payload == nil {
		payload = []byte{}
	}
	var sent Credential
	ans, s, err := c.doCurrent(ctx, &tok, &sent, func(s *session) (wire.Request, error) {
		if limit := s.welcome.MaxRecordBytes; limit > 0 && uint64(len(payload)) > limit {
			// Final: checked before sending, as the server would.
			return nil, &Error{Code: CodeTooLarge, Limit: &limit,
				Detail: fmt.Sprintf("payload of %d bytes exceeds max_record_bytes %d", len(payload), limit)}
		}
		cur, err := c.current(cred)
		if err != nil {
			return nil, err
		}
		sent = cur
		return &wire.Tell{Conversation: cur.Conversation, Participant: cur.Participant,
			Generation: cur.Generation, Token: tok, Payload: payload}, nil
	})
	if err != nil {
		return 0, err
	}
	switch a := ans.(type) {
	case *wire.Told:
		return a.Seq, nil
	case *wire.Error:
		return 0, c.noticeRefusal(s, sent.key(), sent.Generation, fromWire(a))
	default:
		return 0, fmt.Errorf("%w: %s answers tell", ErrProtocol, ans.Type())
	}
}

// staleRetries bounds how often a tell, ack or leave refused
// stale_authority by the client's own doing is sent again.
const staleRetries = 3

// doCurrent is do, with retry, for a request that presents the
// participant's current credential, which build records in *sent: one
// refused stale_authority by the client's own doing (staleByUs) is sent
// again, with its token, at most staleRetries times. The refusal came
// after the token check, so nothing was done: a call that ends while
// staleByUs waits returns the context's error, not in doubt.
func (c *Client) doCurrent(ctx context.Context, tok *Token, sent *Credential, build func(s *session) (wire.Request, error)) (wire.Message, *session, error) {
	for tries := 0; ; tries++ {
		ans, s, err := c.do(ctx, tok, true, build)
		if err != nil || tries == staleRetries {
			return ans, s, err
		}
		ours, err := c.staleByUs(ctx, ans, *sent)
		if err != nil {
			return nil, nil, err
		}
		if !ours {
			return ans, s, nil
		}
	}
}

// staleByUs reports whether ans refuses a request that presented sent as
// stale_authority because an attach of the client's own moved the
// participant on: the request is then sent again presenting the newer
// credential. An attach of the participant may be in flight (a deferred
// re-attachment, say, whose answer comes after the refusal) or in doubt
// (its answer lost): staleByUs first waits for the one in flight to end
// (awaitAttach), then settles the one in doubt (settleAttach), and then
// looks whether the credential moved on. Its error is ctx's, or
// ErrClosed, while it waits, or the *LostError of a participant whose
// attach in doubt found it superseded by another client (OnLost is
// called, but for a participant a Leave is retiring: the leave's
// refusal stands).
func (c *Client) staleByUs(ctx context.Context, ans wire.Message, sent Credential) (bool, error) {
	e, ok := ans.(*wire.Error)
	if !ok || e.Code != wire.CodeStaleAuthority {
		return false, nil
	}
	k := sent.key()
	c.mu.Lock()
	m := c.members[k]
	c.mu.Unlock()
	if m == nil {
		return false, nil
	}
	if c.movedOn(sent) {
		return true, nil
	}
	if err := c.awaitAttach(ctx, m); err != nil {
		return false, err
	}
	if c.movedOn(sent) {
		return true, nil
	}
	if !c.intents.inDoubt(k) {
		return false, nil
	}
	err := c.settleAttach(ctx, m)
	switch {
	case errors.Is(err, ErrClosed), err != nil && ctx.Err() != nil:
		return false, err
	case errors.Is(err, ErrParticipantLost):
		c.mu.Lock()
		leaving := m.leaving
		c.mu.Unlock()
		if leaving {
			// A lost participant may still have left: the leave's
			// refusal stands.
			return false, nil
		}
		// The attach that settles it found the participant superseded:
		// what its deferred re-attachment would have reported.
		c.log.Error().Err(err).Msg("participant lost")
		c.lostCallback(m, err)
		return false, err
	}
	return c.movedOn(sent), nil
}

// movedOn reports whether the client holds a credential of sent's
// participant newer than sent, and still holds the participant.
func (c *Client) movedOn(sent Credential) bool {
	cur, err := c.current(sent)
	return err == nil && cur.Generation > sent.Generation
}

// awaitAttach waits until no attach of m is in flight: one that holds
// m.attachMu has then ended, and recorded what it learned.
func (c *Client) awaitAttach(ctx context.Context, m *member) error {
	select {
	case m.attachMu <- struct{}{}:
		<-m.attachMu
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return ErrClosed
	}
}

// Ack acknowledges every record through seq through for the participant
// and returns its durable cursor. Acks are cumulative, so one retried after
// a lost answer is harmless: an ack below the cursor (ack_regression: a
// later ack moved it past through) is acked too, and returns the cursor.
// A stale_authority refusal of the client's own doing is retried as for
// Tell. Errors: *Error (ack_gap, compacted, no_binding, ...), a *LostError,
// ErrClosed or ctx's error.
func (c *Client) Ack(ctx context.Context, cred Credential, through uint64) (cursor uint64, err error) {
	var sent Credential
	ans, s, err := c.doCurrent(ctx, nil, &sent, func(*session) (wire.Request, error) {
		cur, err := c.current(cred)
		if err != nil {
			return nil, err
		}
		sent = cur
		return &wire.Ack{Conversation: cur.Conversation, Participant: cur.Participant,
			Generation: cur.Generation, Through: through}, nil
	})
	if err != nil {
		return 0, err
	}
	switch a := ans.(type) {
	case *wire.Acked:
		c.advanceCursor(sent.key(), a.Cursor)
		return a.Cursor, nil
	case *wire.Error:
		e := fromWire(a)
		if e.Cursor != nil {
			c.advanceCursor(sent.key(), *e.Cursor)
			if e.Code == CodeAckRegression && *e.Cursor >= through {
				return *e.Cursor, nil
			}
		}
		return 0, c.noticeRefusal(s, sent.key(), sent.Generation, e)
	default:
		return 0, fmt.Errorf("%w: %s answers ack", ErrProtocol, ans.Type())
	}
}

// Detach ends the participant's binding cleanly and returns the seq of its
// detached record. The client keeps the credential but no longer binds
// the participant on its own, whatever the outcome: from the call on, no
// re-attachment after a reconnect (nor a deferred one) binds it, and an
// attach of it in flight ends before the detach is sent. A detach whose
// answer was lost is resent as it is, with its token and without
// attaching first: it replays if it committed; if not, the binding ended
// with the connection, and the call returns no_binding (the participant
// is not bound; nothing was detached). Attach takes it up again. Errors
// as for Tell.
func (c *Client) Detach(ctx context.Context, cred Credential, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	c.release(cred.key(), false)
	var sent Credential
	ans, s, err := c.do(ctx, &tok, true, func(*session) (wire.Request, error) {
		cur, err := c.current(cred)
		if err != nil {
			return nil, err
		}
		sent = cur
		return &wire.Detach{Conversation: cur.Conversation, Participant: cur.Participant,
			Generation: cur.Generation, Token: tok}, nil
	})
	if err != nil {
		return 0, err
	}
	switch a := ans.(type) {
	case *wire.Detached:
		c.mu.Lock()
		if m := c.members[cred.key()]; m != nil && !m.wantBound {
			m.sess = nil
		}
		c.mu.Unlock()
		return a.Seq, nil
	case *wire.Error:
		return 0, c.noticeRefusal(s, sent.key(), sent.Generation, fromWire(a))
	default:
		return 0, fmt.Errorf("%w: %s answers detach", ErrProtocol, ans.Type())
	}
}

// Leave retires the participant for good and returns the seq of its left
// record; the client forgets it. From the call on the client no longer
// binds the participant on its own (as for Detach), and a refusal retired
// of its binding check or re-attachment meanwhile is the leave's doing,
// not a loss (no OnLost). A leave refused stale_authority by the client's
// own doing is sent again as a tell is (doCurrent): when an attach of the
// client is in doubt (its re-attachment committed and its answer was
// lost, so the generation moved on), that attach is sent again first,
// with its token, and then the leave, with its token and the credential
// learned. A leave retried after a lost answer
// replays even though the participant is retired by then. Errors as for
// Tell.
func (c *Client) Leave(ctx context.Context, cred Credential, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	c.release(cred.key(), true)
	var sent Credential
	ans, _, err := c.doCurrent(ctx, &tok, &sent, func(*session) (wire.Request, error) {
		// A lost participant may still have left: the token decides.
		cur, _ := c.current(cred)
		sent = cur
		return &wire.Leave{Conversation: cur.Conversation, Participant: cur.Participant,
			Generation: cur.Generation, Secret: cur.Secret, Token: tok}, nil
	})
	if err == nil {
		if a, ok := ans.(*wire.Left); ok {
			c.mu.Lock()
			delete(c.members, cred.key())
			c.mu.Unlock()
			c.intents.forget(cred.key())
			return a.Seq, nil
		}
	}
	if !errors.Is(err, ErrInDoubt) {
		// Not left: a retired refusal from now on is not this leave's.
		c.mu.Lock()
		if m := c.members[cred.key()]; m != nil {
			m.leaving = false
		}
		c.mu.Unlock()
	}
	switch a := ans.(type) {
	case nil:
		return 0, err
	case *wire.Error:
		return 0, fromWire(a)
	default:
		return 0, fmt.Errorf("%w: %s answers leave", ErrProtocol, ans.Type())
	}
}

// settleAttach learns the outcome of the attach of m in doubt, if any:
// it sends that attach again (its token, its presented credential) on
// the ready connection, which replays the credential it minted if it
// committed, and binds the participant there. A participant a Detach
// released is not attached (errReleased); one a Leave is retiring is
// (settling), since the leave must present the credential its attach
// minted. A backlog_full refusal is returned at once: it proves the
// token not committed.
func (c *Client) settleAttach(ctx context.Context, m *member) error {
	c.mu.Lock()
	leaving := m.leaving
	if leaving {
		m.settling++
	}
	c.mu.Unlock()
	if leaving {
		defer func() {
			c.mu.Lock()
			m.settling--
			c.mu.Unlock()
		}()
	}
	for {
		s, err := c.ready(ctx)
		if err != nil {
			return err
		}
		_, err = c.attachOn(ctx, s, m, -1)
		if !errors.Is(err, errLost) {
			return err
		}
	}
}

// release stops the client from binding the participant of k on its own
// (a re-attachment after a reconnect, a deferred one): for a Detach or,
// with leaving, a Leave. It then waits for an attach of it in flight to
// end, so that none binds it after the caller's request is sent.
func (c *Client) release(k key, leaving bool) {
	c.mu.Lock()
	m := c.members[k]
	if m != nil {
		m.wantBound = false
		m.leaving = m.leaving || leaving
	}
	c.mu.Unlock()
	if m != nil {
		// attachOn looks at wantBound under attachMu before each send:
		// a barrier, which waits for the attach in flight.
		m.attachMu <- struct{}{}
		<-m.attachMu
	}
}

// Ping asks the server for a pong. It is not retried: a connection lost
// before the pong is ErrConnectionLost.
func (c *Client) Ping(ctx context.Context) error {
	ans, _, err := c.do(ctx, nil, false, func(*session) (wire.Request, error) {
		return &wire.Ping{}, nil
	})
	if err != nil {
		return err
	}
	switch a := ans.(type) {
	case *wire.Pong:
		return nil
	case *wire.Error:
		return fromWire(a)
	default:
		return fmt.Errorf("%w: %s answers ping", ErrProtocol, ans.Type())
	}
}
