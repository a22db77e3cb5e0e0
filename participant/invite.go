package participant

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// EnrollPolicy says who may enroll into a conversation.
type EnrollPolicy string

// Enroll policies.
const (
	// EnrollOpen lets any connection enroll into any conversation. It is
	// the zero Options' policy.
	EnrollOpen EnrollPolicy = "open"
	// EnrollInvite requires every enroll to carry an invitation to its
	// conversation that the operator minted offline (MintInvite,
	// participantctl invite) and that has not expired.
	EnrollInvite EnrollPolicy = "invite"
)

// ParseEnrollPolicy returns the policy named s ("open" or "invite").
func ParseEnrollPolicy(s string) (EnrollPolicy, error) {
	switch p := EnrollPolicy(s); p {
	case EnrollOpen, EnrollInvite:
		return p, nil
	}
	return "", fmt.Errorf("participant: enroll policy %q: want open or invite", s)
}

// An invitation admits enrolls into one conversation until it expires.
// Version 1 admits any number of them; version 2 at most its use count:
//
//	bytes  field
//	1      version, 1 or 2
//	8      conversation id, big-endian
//	8      expiry, unix milliseconds, big-endian
//	4      version 2 only: uses, big-endian, at least 1
//	8      version 2 only: id, random, naming the invitation's uses
//	32     HMAC-SHA256(node key, inviteDomain ‖ the 17 or 29 bytes above)
//
// Its text form (what participantctl invite prints) is unpadded base64url.
// The MAC is under the node key, domain-separated from the attach secrets
// (secretDomain), so that no invitation is ever a valid secret or the
// reverse, and nothing but node.key needs to be created, protected and
// backed up. An invitation is a bearer capability: anyone holding it may
// enroll until it expires (or, in version 2, until its uses are spent);
// expiry is the way to revoke (rotating node.key would also void every
// credential).
//
// A use is recorded in the enroll row it admitted (the row's Payload holds
// the invitation's id, 8 bytes big-endian), which commits with the
// enroll's token or not at all: so a crash either keeps both or neither,
// and a retry of the same token replays that row instead of spending
// another use. The conversation's state counts them
// (outbox.State.InviteUses), and its checkpoint keeps the count when
// compaction removes the rows.
const (
	// InviteSize is a version 1 invitation's size in bytes, and
	// InviteUsesSize a version 2 one's.
	InviteSize     = 1 + 8 + 8 + sha256.Size
	InviteUsesSize = 1 + 8 + 8 + 4 + 8 + sha256.Size
	inviteVersion  = 1
	inviteVersion2 = 2
	inviteDomain   = "participantd.invite.v1\x00"
)

// Errors of MintInvite and ParseInvite.
var (
	// ErrInviteExpiry reports an expiry that is not after the minting time.
	ErrInviteExpiry = errors.New("participant: invitation expiry is not in the future")
	// ErrInviteText reports text that is not an invitation's text form.
	ErrInviteText = errors.New("participant: not an invitation")
)

// MintInvite returns the invitation to conversation c valid until expires
// under nodeKey, in binary form, admitting any number of enrolls (version
// 1). now is the minting time. Errors: ErrInviteExpiry, or a node key of
// the wrong size.
func MintInvite(nodeKey []byte, c ConversationID, now, expires time.Time) ([]byte, error) {
	return MintInviteUses(nodeKey, c, now, expires, 0)
}

// MintInviteUses is MintInvite for an invitation that admits at most uses
// enrolls (version 2, with a random id); uses 0 means any number (version
// 1). Errors: those of MintInvite, or a failing random source.
func MintInviteUses(nodeKey []byte, c ConversationID, now, expires time.Time, uses uint32) ([]byte, error) {
	if len(nodeKey) != NodeKeySize {
		return nil, fmt.Errorf("participant: node key has %d bytes, want %d", len(nodeKey), NodeKeySize)
	}
	if !expires.After(now) {
		return nil, ErrInviteExpiry
	}
	head := make([]byte, 17, InviteUsesSize)
	head[0] = inviteVersion
	binary.BigEndian.PutUint64(head[1:], uint64(c))
	binary.BigEndian.PutUint64(head[9:], uint64(expires.UnixMilli()))
	if uses > 0 {
		head[0] = inviteVersion2
		head = binary.BigEndian.AppendUint32(head, uses)
		var id [8]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, fmt.Errorf("participant: invitation id: %w", err)
		}
		head = append(head, id[:]...)
	}
	mac := inviteMAC(nodeKey, head)
	return append(head, mac[:]...), nil
}

// InviteText returns the text form of invitation inv.
func InviteText(inv []byte) string { return base64.RawURLEncoding.EncodeToString(inv) }

// ParseInvite returns the binary form of an invitation's text form. It
// checks the encoding and the size only; the server verifies the rest.
func ParseInvite(s string) ([]byte, error) {
	inv, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || (len(inv) != InviteSize && len(inv) != InviteUsesSize) {
		return nil, ErrInviteText
	}
	return inv, nil
}

func inviteMAC(key, head []byte) [sha256.Size]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(inviteDomain))
	m.Write(head)
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// inviteGrant is what a verified invitation grants: uses enrolls (0: any
// number), counted under id.
type inviteGrant struct {
	id   uint64
	uses uint32
}

// checkInvite verifies that inv admits an enroll into conversation c at
// now, its use count aside: see verifyInvite.
func checkInvite(key []byte, c ConversationID, now time.Time, inv []byte) *Error {
	_, e := verifyInvite(key, c, now, inv)
	return e
}

// verifyInvite verifies that inv admits an enroll into conversation c at
// now and returns what it grants; the caller checks its use count against
// the conversation. It refuses invite_required when there is none,
// invite_invalid when it is malformed, does not verify (forged, minted for
// another conversation or under another node key) or has expired.
func verifyInvite(key []byte, c ConversationID, now time.Time, inv []byte) (inviteGrant, *Error) {
	if len(inv) == 0 {
		return inviteGrant{}, refuse(CodeInviteRequired, "enrolling into conversation %v needs an invitation", c)
	}
	var headLen int
	switch {
	case len(inv) == InviteSize && inv[0] == inviteVersion:
		headLen = 17
	case len(inv) == InviteUsesSize && inv[0] == inviteVersion2:
		headLen = 29
	default:
		return inviteGrant{}, refuse(CodeInviteInvalid, "the invitation is malformed")
	}
	// The MAC covers the conversation this enroll names, not the one the
	// invitation claims: an invitation to another conversation does not
	// verify.
	head := append([]byte(nil), inv[:headLen]...)
	binary.BigEndian.PutUint64(head[1:], uint64(c))
	want := inviteMAC(key, head)
	if !hmac.Equal(want[:], inv[headLen:]) {
		return inviteGrant{}, refuse(CodeInviteInvalid, "the invitation does not verify for conversation %v", c)
	}
	expires := int64(binary.BigEndian.Uint64(inv[9:17]))
	if now.UnixMilli() >= expires {
		return inviteGrant{}, refuse(CodeInviteInvalid, "the invitation expired at %s", time.UnixMilli(expires).UTC().Format(time.RFC3339))
	}
	var g inviteGrant
	if headLen == 29 {
		g.uses = binary.BigEndian.Uint32(inv[17:21])
		g.id = binary.BigEndian.Uint64(inv[21:29])
		if g.uses == 0 {
			return inviteGrant{}, refuse(CodeInviteInvalid, "the invitation is malformed")
		}
	}
	return g, nil
}

// payload returns the Payload of an enroll row admitted by g: its id,
// when g has a use count; nil otherwise.
func (g inviteGrant) payload() []byte {
	if g.uses == 0 {
		return nil
	}
	return binary.BigEndian.AppendUint64(nil, g.id)
}
