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
// whoever accepts it (the server passes the peer's address, an IPv6 /64,
// as its per-address limits do). A conversation is charged to one
// principal: the first whose enroll, tell or attach commits in it in this
// process's life, which for a conversation created since the start is its
// creator. A principal may be charged with at most ClientShare percent of
// each budget: past it, its operations that add records to a conversation
// charged to it are backlog_full, and its operations that would charge it
// with one more conversation are capacity_exceeded (scope "client"). So
// one principal's conversations retain at most a tenth of the budget by
// default, and the headroom below the ceiling admits everyone else until
// ten principals have each filled theirs.
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

// shareLimits are the most one principal may be charged with.
type shareLimits struct {
	records, conversations int64
}

func (o *Options) shareLimits() shareLimits {
	return shareLimits{
		records:       max(1, int64(o.BacklogRecords)*int64(o.ClientShare)/100),
		conversations: max(1, int64(o.MaxConversations)*int64(o.ClientShare)/100),
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
// records: the conversation's principal, or sh when it has none yet (the
// operation would charge it), must stay within its share. catchUp relaxes
// the records' share by an eighth, as it relaxes the other limits.
func (b *batch) admitShare(sh *share, held int64, catchUp bool) *Error {
	charged := b.cv.share.Load()
	if charged == nil {
		charged = sh
	}
	if charged == nil {
		return nil
	}
	lim := b.s.shareLimits
	mine := charged.records.Load() + held
	if b.cv.share.Load() == charged {
		mine -= int64(len(b.live.Records))
	} else if n := charged.conversations.Load(); n >= lim.conversations {
		e := refuse(CodeCapacityExceeded, "this client's conversations number %d, its share of the server's; leave or finish some first", n)
		e.Limit = uint64(lim.conversations)
		return e
	}
	if mine >= lim.records+lim.records/8 || mine >= lim.records && !catchUp {
		e := refuse(CodeBacklogFull, "this client's conversations retain %d records awaiting acknowledgement, its share of the server's; nothing was done, retry later with the same token", mine)
		e.Limit = uint64(lim.records)
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
		sh.records.Add(int64(len(cv.state.Records)))
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
