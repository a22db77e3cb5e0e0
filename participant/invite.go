package participant

import (
	"crypto/hmac"
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

// An invitation admits enrolls into one conversation until it expires:
//
//	bytes  field
//	1      version, 1
//	8      conversation id, big-endian
//	8      expiry, unix milliseconds, big-endian
//	32     HMAC-SHA256(node key, inviteDomain ‖ the 17 bytes above)
//
// Its text form (what participantctl invite prints) is unpadded base64url.
// The MAC is under the node key, domain-separated from the attach secrets
// (secretDomain), so that no invitation is ever a valid secret or the
// reverse, and nothing but node.key needs to be created, protected and
// backed up. An invitation is a bearer capability: anyone holding it may
// enroll, any number of times, until it expires; expiry is the way to
// revoke (rotating node.key would also void every credential).
const (
	// InviteSize is an invitation's size in bytes.
	InviteSize    = 1 + 8 + 8 + sha256.Size
	inviteVersion = 1
	inviteDomain  = "participantd.invite.v1\x00"
)

// Errors of MintInvite and ParseInvite.
var (
	// ErrInviteExpiry reports an expiry that is not after the minting time.
	ErrInviteExpiry = errors.New("participant: invitation expiry is not in the future")
	// ErrInviteText reports text that is not an invitation's text form.
	ErrInviteText = errors.New("participant: not an invitation")
)

// MintInvite returns the invitation to conversation c valid until expires
// under nodeKey, in binary form. now is the minting time. Errors:
// ErrInviteExpiry, or a node key of the wrong size.
func MintInvite(nodeKey []byte, c ConversationID, now, expires time.Time) ([]byte, error) {
	if len(nodeKey) != NodeKeySize {
		return nil, fmt.Errorf("participant: node key has %d bytes, want %d", len(nodeKey), NodeKeySize)
	}
	if !expires.After(now) {
		return nil, ErrInviteExpiry
	}
	inv := make([]byte, InviteSize)
	inv[0] = inviteVersion
	binary.BigEndian.PutUint64(inv[1:], uint64(c))
	binary.BigEndian.PutUint64(inv[9:], uint64(expires.UnixMilli()))
	mac := inviteMAC(nodeKey, inv[:17])
	copy(inv[17:], mac[:])
	return inv, nil
}

// InviteText returns the text form of invitation inv.
func InviteText(inv []byte) string { return base64.RawURLEncoding.EncodeToString(inv) }

// ParseInvite returns the binary form of an invitation's text form. It
// checks the encoding and the size only; the server verifies the rest.
func ParseInvite(s string) ([]byte, error) {
	inv, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(inv) != InviteSize {
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

// checkInvite verifies that inv admits an enroll into conversation c at
// now: invite_required when there is none, invite_invalid when it is
// malformed, does not verify (forged, minted for another conversation or
// under another node key) or has expired.
func checkInvite(key []byte, c ConversationID, now time.Time, inv []byte) *Error {
	if len(inv) == 0 {
		return refuse(CodeInviteRequired, "enrolling into conversation %v needs an invitation", c)
	}
	if len(inv) != InviteSize || inv[0] != inviteVersion {
		return refuse(CodeInviteInvalid, "the invitation is malformed")
	}
	// The MAC covers the conversation this enroll names, not the one the
	// invitation claims: an invitation to another conversation does not
	// verify.
	var head [17]byte
	head[0] = inviteVersion
	binary.BigEndian.PutUint64(head[1:], uint64(c))
	copy(head[9:], inv[9:17])
	want := inviteMAC(key, head[:])
	if !hmac.Equal(want[:], inv[17:]) {
		return refuse(CodeInviteInvalid, "the invitation does not verify for conversation %v", c)
	}
	expires := int64(binary.BigEndian.Uint64(inv[9:17]))
	if now.UnixMilli() >= expires {
		return refuse(CodeInviteInvalid, "the invitation expired at %s", time.UnixMilli(expires).UTC().Format(time.RFC3339))
	}
	return nil
}
