package client

// Attaching: the re-attach of every member on a new connection, the
// background retry of one refused backlog_full, and the attach intent
// both share with Client.Attach (one token and presented credential per
// intended attach, renewed once if the token expired).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/wire"
)

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
				c.movedAway(m)
			case errors.Is(err, errForgotten), errors.Is(err, errReleased):
				// A Cluster moved it to another node's Client meanwhile,
				// or a Detach or Leave released it.
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
			c.movedAway(m)
			return
		case errors.Is(err, errForgotten), errors.Is(err, errReleased):
			return
		case !errors.Is(err, ErrBacklogFull):
			c.log.Warn().Err(err).Stringer("participant", c.credential(m)).Msg("deferred re-attach refused; retrying")
		}
	}
}

// movedAway forgets m, whose attach was refused moved: its conversation
// is served by another node now, so this connection no longer holds it.
// A Cluster is told, and attaches it there.
func (c *Client) movedAway(m *member) {
	cred := c.credential(m)
	c.forget(cred)
	c.unboundAll(cred)
}

// errReleased is an attach of a member a Detach or Leave released
// (Client.release) before the attach was sent.
var errReleased = errors.New("client: participant detached or leaving; not attached")

// errForgotten is an attach of a member the Client no longer holds: it
// left, or its Cluster moved it to another node's Client.
var errForgotten = errors.New("client: participant no longer held by this connection")

// attachOn attaches m on s, retrying in_doubt on s and backlog_full for
// backlogWait (as callOnWait), and returns the new credential. It returns
// errLost if s ends first, errForgotten if m is no longer held; a refusal
// that makes the credential unusable marks m lost and returns its
// *LostError. A refusal that commits nothing (backlog_full, unavailable,
// moved, ...) keeps the participant's intent: the next attempt, on this
// node or, in a Cluster, on any other, sends the same token and presented
// credential. A token_expired refusal renews the intent's token once
// (renewExpiredLocked) and tries again.
func (c *Client) attachOn(ctx context.Context, s *session, m *member, backlogWait time.Duration) (Credential, error) {
	select {
	case m.attachMu <- struct{}{}:
	case <-ctx.Done():
		return Credential{}, ctx.Err()
	}
	defer func() { <-m.attachMu }()
	for {
		c.mu.Lock()
		if m.lost != nil {
			err := m.lost
			m.nextToken = nil
			c.mu.Unlock()
			return Credential{}, err
		}
		if c.members[m.cred.key()] != m {
			m.nextToken = nil
			c.mu.Unlock()
			return Credential{}, errForgotten
		}
		if !m.wantBound && m.settling == 0 {
			// A Detach or Leave released it: no attach of it goes out
			// once its request may have.
			m.nextToken = nil
			c.mu.Unlock()
			return Credential{}, errReleased
		}
		if m.sess == s && s.alive() && !c.intents.mayMoveOn(m.cred) {
			// Bound here already: a supplied token is not needed, and
			// must not name a later attach. Not when an attach that may
			// have moved the participant on from m.cred is in doubt (one
			// of its Cluster's, through another node): that binding may
			// be gone, and the attach is sent again to learn it.
			cred := m.cred
			m.nextToken = nil
			c.mu.Unlock()
			return cred, nil
		}
		cur, supplied := m.cred, m.nextToken
		m.nextToken = nil
		c.mu.Unlock()
		in, p, tok, intended := c.intents.intend(cur, supplied)

		// OnIntent sees every token before its first send: an intent's
		// first, and the one that renewed it.
		if !intended {
			if err := c.intend(Intent{Op: IntentAttach, Conversation: p.Conversation, Presented: p, Token: tok}); err != nil {
				// An intent never sent is in doubt nowhere: drop it. A
				// renewed one is kept with its renewal spent; the next
				// attempt asks OnIntent again.
				c.intents.dropUnsent(in)
				return Credential{}, err
			}
		}
		c.intents.sending(in, s)

		ans, err := c.callOnWait(ctx, s, &wire.Attach{Conversation: p.Conversation, Participant: p.Participant,
			Generation: p.Generation, Secret: p.Secret, Token: tok}, backlogWait, nil)
		if err != nil {
			return Credential{}, err
		}
		switch a := ans.(type) {
		case *wire.Attached:
			minted := Credential{Conversation: p.Conversation, Participant: p.Participant, Generation: a.Generation, Secret: a.Secret}
			// A replay marked bound names a binding made by this token;
			// it is this session's only if the token went out on no
			// other session, of this Client or of any other of its
			// Cluster.
			only := c.intents.settle(in, s, minted)
			c.mu.Lock()
			newer := minted.Generation >= m.cred.Generation
			if newer {
				m.cred = minted
			}
			m.cursor = max(m.cursor, a.Cursor)
			// Bound on s only while s is alive, under c.mu: the
			// supervisor, which looks under c.mu once s is dead, then
			// sees the binding end with s.
			here := newer && s.alive() && (a.Replay == nil || (*a.Replay == wire.ReplayBound && only))
			if here {
				m.sess = s
			} else {
				m.sess = nil
			}
			cred := m.cred
			c.mu.Unlock()
			c.credentialChanged(cred)
			if here {
				if c.bound != nil {
					c.bound(c, cred)
				}
				return cred, nil
			}
			if !s.alive() {
				return Credential{}, errLost
			}
			// The attach committed, but its binding is elsewhere or gone:
			// attach again with the credential it minted.
		case *wire.Error:
			e := fromWire(a)
			if e.Code == CodeTokenExpired && c.intents.renew(in) {
				c.log.Info().Stringer("participant", p).Msg("attach token expired; retrying with a new token")
				continue
			}
			if (e.Code == CodeReceiptExpired || e.Code == CodeStaleAuthority) && c.intents.replaced(in) {
				// Another attach of the participant, by this client or
				// another of its Cluster's, is in doubt presenting a
				// newer credential: it may be what moved the participant
				// on. Send that one (its token, its credential) instead.
				continue
			}
			if newest, ok := c.ownedPast(p, e); ok {
				// Superseded by an attach of this client (or of another
				// of its Cluster's) that answered meanwhile: not a loss.
				c.intents.settle(in, s, Credential{})
				c.mu.Lock()
				if newest.Generation > m.cred.Generation {
					m.cred = newest
				}
				c.mu.Unlock()
				continue
			}
			switch e.Code {
			case CodeReceiptExpired, CodeStaleAuthority, CodeRetired, CodeUnknownParticipant,
				// Final answers about the intent's token: an invalid
				// one, or one that expired again after its renewal or
				// that the caller supplied, whose earlier sends may
				// have committed (and moved the credential on).
				CodeTokenExpired, CodeTokenInvalid:
				c.intents.settle(in, s, Credential{})
				lost := &LostError{Conversation: p.Conversation, Participant: p.Participant, Err: e}
				c.mu.Lock()
				m.lost, m.sess = lost, nil
				c.mu.Unlock()
				return Credential{}, lost
			}
			return Credential{}, e
		default:
			return Credential{}, fmt.Errorf("%w: %s answers attach", ErrProtocol, ans.Type())
		}
	}
}

// ownedPast reports whether e, the refusal of an attach presenting p
// (receipt_expired: a later attach superseded its token's; or
// stale_authority: p's generation is not the current one), names a
// current generation that this client holds the credential of: one of
// its own attaches, or another of its Cluster's, moved the participant
// on. It returns that credential.
func (c *Client) ownedPast(p Credential, e *Error) (Credential, bool) {
	if (e.Code != CodeReceiptExpired && e.Code != CodeStaleAuthority) || e.Generation == nil {
		return Credential{}, false
	}
	newest, ok := c.intents.newestOf(p.key())
	if !ok || newest.Generation < *e.Generation || newest.Generation <= p.Generation {
		return Credential{}, false
	}
	return newest, true
}
