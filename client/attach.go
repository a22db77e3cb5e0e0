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
