package client

import "sync"

// attachIntent is one intended attach: the credential it presents stays
// the same on every retry, and so does its token, but for one renewal:
// a token refused token_expired is replaced once by a fresh one (see
// renewExpiredLocked). Its fields are guarded by the intents table that
// holds it.
type attachIntent struct {
	token     Token
	presented Credential
	// sentOn is every session the token was sent on, of any Client that
	// shares the table.
	sentOn map[*session]bool
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
// after OnIntent accepts it. The table's mu is held.
func (in *attachIntent) renewExpiredLocked() bool {
	if in.supplied || in.renewed {
		return false
	}
	in.token, in.renewed, in.intended = NewToken(), true, false
	in.sentOn = make(map[*session]bool)
	return true
}

// onlyOnLocked reports whether s is the one session the token went out
// on. The table's mu is held.
func (in *attachIntent) onlyOnLocked(s *session) bool {
	return len(in.sentOn) == 1 && in.sentOn[s]
}

// intents is the attach in doubt of each participant, and the newest
// credential learned of it. A Client has a table of its own; the Clients
// of a Cluster share the Cluster's, so that one intended attach keeps one
// token and one presented credential on every node it is tried on,
// whichever Client sends it (the Cluster's attach on a conversation's new
// owner, a node Client's re-attachment after a reconnect), and a Client
// never presents a generation that another one already moved past.
type intents struct {
	// mu guards the maps and the fields of every intent in them. A leaf:
	// it may be taken with Client.mu or Cluster.mu held, and nothing is
	// taken while it is held.
	mu      sync.Mutex
	pending map[key]*attachIntent
	newest  map[key]Credential
}

func newIntents() *intents {
	return &intents{pending: make(map[key]*attachIntent), newest: make(map[key]Credential)}
}

// intend returns the intent of an attach of cred's participant: the one
// in doubt, unless cred (or a credential learned since) is newer than the
// one it presents, which settles it (it committed and its answer was
// learned, or another attach superseded it); else a new intent presenting
// the newest credential known, with token supplied when it is not nil.
// It returns the intent and what to send.
func (t *intents) intend(cred Credential, supplied *Token) (*attachIntent, Credential, Token, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := cred.key()
	if n, ok := t.newest[k]; ok && n.Generation > cred.Generation {
		cred = n
	}
	in := t.pending[k]
	if in == nil || in.presented.Generation < cred.Generation {
		in = &attachIntent{token: NewToken(), presented: cred, sentOn: make(map[*session]bool)}
		if supplied != nil {
			in.token, in.supplied = *supplied, true
		}
		t.pending[k] = in
	}
	return in, in.presented, in.token, in.intended
}

// sending records that in's token, accepted by OnIntent, goes out on s.
func (t *intents) sending(in *attachIntent, s *session) {
	t.mu.Lock()
	in.intended = true
	in.sentOn[s] = true
	t.mu.Unlock()
}

// settle forgets in, whose outcome is known, and records cred, the
// credential it minted when it committed (zero otherwise). It returns
// whether the token went out on s alone and was not the caller's, which
// makes a replay marked bound name s's binding.
func (t *intents) settle(in *attachIntent, s *session, cred Credential) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := in.presented.key()
	if t.pending[k] == in {
		delete(t.pending, k)
	}
	if cred.Generation > t.newest[k].Generation {
		t.newest[k] = cred
	}
	return in.onlyOnLocked(s) && !in.supplied
}

// dropUnsent forgets in, whose token OnIntent refused, if it is still
// the pending intent of its participant: a token never sent is in doubt
// nowhere. A renewed intent is kept, its renewal spent, since its first
// token was sent.
func (t *intents) dropUnsent(in *attachIntent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := in.presented.key()
	if t.pending[k] == in && !in.renewed {
		delete(t.pending, k)
	}
}

// renew replaces in's expired token (renewExpiredLocked) if in is still
// pending, and reports whether it did.
func (t *intents) renew(in *attachIntent) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending[in.presented.key()] == in && in.renewExpiredLocked()
}

// replaced reports whether another intent than in, presenting a newer
// credential, is in doubt for in's participant.
func (t *intents) replaced(in *attachIntent) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pending[in.presented.key()]
	return p != nil && p != in && p.presented.Generation > in.presented.Generation
}

// inDoubt reports whether an attach of k is in doubt.
func (t *intents) inDoubt(k key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending[k] != nil
}

// mayMoveOn reports whether an attach of cred's participant presenting
// cred or a newer credential is in doubt: if it committed, the binding
// cred was minted for is gone.
func (t *intents) mayMoveOn(cred Credential) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.pending[cred.key()]
	return in != nil && in.presented.Generation >= cred.Generation
}

// learn records cred as known, when it is the newest.
func (t *intents) learn(cred Credential) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k := cred.key(); cred.Generation > t.newest[k].Generation {
		t.newest[k] = cred
	}
}

// newestOf returns the newest credential learned of k.
func (t *intents) newestOf(k key) (Credential, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.newest[k]
	return c, ok
}

// dropPending forgets the attach of k in doubt, if any (its participant
// is no longer held).
func (t *intents) dropPending(k key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pending, k)
}

// forget drops all that is known of k (it left).
func (t *intents) forget(k key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pending, k)
	delete(t.newest, k)
}
