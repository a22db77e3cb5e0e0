package participant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"sync/atomic"
)

// Shares of the service-wide budgets (docs/DESIGN.md, Threat model). The
// budgets of retained records (BacklogRecords) and of conversations
// (MaxConversations) protect the process; a share protects the other
// clients from one of them. Each connection acts for a Principal, named by
// whoever accepts it, opaque here (the server passes the client
// certificate's identity under mutual TLS, else the peer's address prefix,
// as its per-address limits do). A conversation is charged to one
// principal: the first whose enroll, tell or attach commits in it in this
// process's life, which for a conversation created since the start is its
// creator. A principal may be charged with at most ClientShare percent of
// each budget: past it, its operations that add records to a conversation
// charged to it are backlog_full, and its operations that would charge it
// with one more conversation are capacity_exceeded (scope "client").
//
// Shares alone leave the budget to whoever has the most principals (a host
// with fourteen addresses has fourteen shares of a tenth), so near full
// the largest holders are refused first, as for the server's byte budgets
// (server/shares.go):
//
//   - above 80 % of BacklogRecords retained, a principal whose
//     conversations retain a twentieth of it or more is backlog_full, and
//     above 80 % of MaxConversations held, a principal charged with a
//     twentieth of them is capacity_exceeded for one more;
//   - past BacklogRecords, a principal whose conversations retain half or
//     more of what is left below the ceiling (a quarter past it) is
//     backlog_full, as a conversation is (backpressure.go): each principal
//     gets at most a third of what is left.
//
// So the last fifth of each budget goes to principals that hold little,
// and a newcomer still commits when many principals filled the rest. Both
// refusals say nothing was done: retried later with the same token, the
// operation commits once the budget drains. An attach of a participant
// with records waiting is held to its share only (an eighth past it). A
// ClientShare of 100 turns the shares and these rules off.
//
// Charging the conversation rather than the teller keeps the account a
// sum over published states, exact and cheap (setStateLocked), like the
// service's. A member that tells into another client's conversation spends
// that conversation's allowance, which MaxBacklogRecords bounds.
// A charge is stored (chargeKey: the principal's key, a keyed hash of its
// name, never the name) in the batch that makes it, before barrier 1, so
// a restart charges each loaded conversation to the same principal again:
// a client's share does not reset when the server restarts. A
// conversation charged before charges were stored is charged, and stored,
// at the first commit of a principal after the start.

// Principal names who a connection acts for, for the shares; "" is nobody:
// such a connection is held to the service-wide budgets only (the server
// passes "" for loopback peers unless told to limit them, as they are
// this machine or a proxy in front of it).
type Principal string

// DefaultClientShare is the default ClientShare, in percent.
const DefaultClientShare = 10

// share is one principal's account. It is kept while the principal has
// a connection or a conversation charged to it: the map of accounts is
// bounded by the connections and the conversations.
type share struct {
	// key is the principal's key in Service.shares and in the store:
	// principalKey of its name.
	key uint64
	// conns counts the principal's connections; guarded by Service.mu.
	conns int
	// records counts the records retained by the published states of the
	// conversations charged to the principal; conversations counts those
	// conversations.
	records       atomic.Int64
	conversations atomic.Int64
}

// shareLimits are the most one principal may be charged with, and the
// rules near full (off is set when ClientShare is 100).
type shareLimits struct {
	records, conversations int64
	off                    bool
	// smallRecords and smallConversations are what a principal may hold
	// and still add to above highRecords and highConversations, 80 % of
	// the budgets.
	smallRecords, highRecords             int64
	smallConversations, highConversations int64
	// budget and ceiling are BacklogRecords and the hard ceiling a
	// quarter past it.
	budget, ceiling int64
}

func (o *Options) shareLimits() shareLimits {
	recs, convs := int64(o.BacklogRecords), int64(o.MaxConversations)
	return shareLimits{
		records:            max(1, recs*int64(o.ClientShare)/100),
		conversations:      max(1, convs*int64(o.ClientShare)/100),
		off:                o.ClientShare >= 100,
		smallRecords:       max(1, recs/20),
		highRecords:        recs * 8 / 10,
		smallConversations: max(1, convs/20),
		highConversations:  convs * 8 / 10,
		budget:             recs,
		ceiling:            recs + recs/4,
	}
}

// principalKey is principal p's key: the first 8 bytes of an HMAC-SHA256
// of its name under the node key (so that the store holds no client
// address), never 0 (the store's "absent").
func principalKey(nodeKey []byte, p Principal) uint64 {
	m := hmac.New(sha256.New, nodeKey)
	m.Write([]byte("participantd.principal\x00"))
	m.Write([]byte(p))
	return binary.BigEndian.Uint64(m.Sum(nil)) | 1
}

// shareLocked returns the account of principal p, nil for nobody, and
// counts one more connection of it. s.mu is held.
//
// +checklocks:s.mu
func (s *Service) shareLocked(p Principal) *share {
	if p == "" {
		return nil
	}
	sh := s.accountLocked(principalKey(s.opts.NodeKey, p))
	sh.conns++
	return sh
}

// accountLocked returns the account of the principal of key k, creating
// it. s.mu is held.
//
// +checklocks:s.mu
func (s *Service) accountLocked(k uint64) *share {
	sh := s.shares[k]
	if sh == nil {
		sh = &share{key: k}
		s.shares[k] = sh
	}
	return sh
}

// unshareLocked counts one connection of sh less, and forgets sh when
// nothing is charged to it any more. s.mu is held.
//
// +checklocks:s.mu
func (s *Service) unshareLocked(sh *share) {
	if sh == nil {
		return
	}
	sh.conns--
	if sh.conns == 0 && sh.conversations.Load() == 0 && s.shares[sh.key] == sh {
		delete(s.shares, sh.key)
	}
}

// Scope of a refusal by a share, for metrics.
const backlogScopeClient = "client"

// admitShare decides whether an operation of a connection acting for sh
// may add records to b's conversation, whose working state retains held
// records against the published state's published, while the service
// retains total (this batch's staged ones included): the conversation's principal, or sh when it has none yet
// (the operation would charge it), must stay within its share and the
// rules near full. catchUp relaxes the records' share by an eighth, and
// lifts the rules near full, as it relaxes the other limits.
func (b *batch) admitShare(sh *share, held, published, total int64, catchUp bool) *Error {
	charged := b.cv.share.Load()
	if charged == nil {
		charged = sh
	}
	if charged == nil {
		return nil
	}
	mine := charged.records.Load() + held
	convs := int64(-1)
	if b.cv.share.Load() == charged {
		mine -= published
	} else {
		// The conversation holds its slot by now (a new one reserved it).
		convs = int64(b.s.conversationSlots.count())
	}
	return b.s.shareRefusal(charged, mine, total, convs, catchUp)
}

// shareRefusal decides for principal sh, whose conversations would retain
// mine records while the service retains total: nil, or backlog_full or
// capacity_exceeded by its share or by the rules near full (see the
// comment at the top). convs is -1, or the operation would charge sh with
// one more conversation while the service holds convs, that one included.
// It is on the path of every tell: a few loads and comparisons.
func (s *Service) shareRefusal(sh *share, mine, total, convs int64, catchUp bool) *Error {
	lim := &s.shareLimits
	if convs >= 0 {
		n := sh.conversations.Load()
		if n >= lim.conversations {
			e := refuse(CodeCapacityExceeded, "this client's conversations number %d, its share of the server's; leave or finish some first", n)
			e.Limit = uint64(lim.conversations)
			return e
		}
		if !lim.off && n >= lim.smallConversations && convs > lim.highConversations {
			e := refuse(CodeCapacityExceeded, "the server would hold %d conversations, over 80%% of its limit, and this client's number %d, a twentieth of it; nothing was done, retry later with the same token or finish some first", convs, n)
			e.Limit = uint64(lim.smallConversations)
			return e
		}
	}
	switch {
	case mine >= lim.records+lim.records/8, mine >= lim.records && !catchUp:
		e := refuse(CodeBacklogFull, "this client's conversations retain %d records awaiting acknowledgement, its share of the server's; nothing was done, retry later with the same token", mine)
		e.Limit = uint64(lim.records)
		return e
	case lim.off || catchUp:
	case total >= lim.budget && 2*mine >= lim.ceiling-total:
		e := refuse(CodeBacklogFull, "the server retains %d records awaiting acknowledgement, past its budget, and this client's conversations %d of them, half of what is left; nothing was done, retry later with the same token", total, mine)
		e.Limit = uint64(lim.budget)
		return e
	case total >= lim.highRecords && mine >= lim.smallRecords:
		e := refuse(CodeBacklogFull, "the server retains %d records awaiting acknowledgement, over 80%% of its budget, and this client's conversations %d of them, a twentieth of it; nothing was done, retry later with the same token", total, mine)
		e.Limit = uint64(lim.smallRecords)
		return e
	}
	return nil
}

// charge charges b's conversation to sh if it is charged to nobody yet,
// and has the batch store the charge (write) unless it is stored. The
// caller holds the conversation's turn.
func (b *batch) charge(sh *share) {
	cv := b.cv
	if sh == nil || cv.share.Load() != nil {
		return
	}
	cv.chargeTo(sh)
	if !cv.chargeStored {
		b.storeCharge = sh.key
	}
}

// chargeTo charges cv to sh; cv is charged to nobody. The caller holds
// cv's turn.
func (cv *conversation) chargeTo(sh *share) {
	cv.mu.Lock()
	defer cv.mu.Unlock()
	cv.share.Store(sh)
	sh.conversations.Add(1)
	if cv.state != nil {
		sh.records.Add(int64(cv.state.Records.Len()))
	}
}

// chargeLoaded charges cv, just loaded, to the principal of key k, its
// stored charge (0: none). The caller holds cv's turn.
func (s *Service) chargeLoaded(cv *conversation, k uint64) {
	cv.chargeStored = k != 0
	if k == 0 || cv.share.Load() != nil {
		return
	}
	s.mu.Lock()
	sh := s.accountLocked(k)
	s.mu.Unlock()
	cv.chargeTo(sh)
}

// uncharge takes a conversation that is being forgotten, never
// registered, off its principal's account.
func (cv *conversation) uncharge() {
	if sh := cv.share.Swap(nil); sh != nil {
		sh.conversations.Add(-1)
	}
}
