package client

import (
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/participantd/participantd/wire"
)

// Token is the 16-byte value that names one intended operation; see
// NewToken and WithToken.
type Token = wire.Token

// Secret is a credential's 32-byte attach secret.
type Secret = wire.Secret

// NewToken returns a fresh token, never all zero: a UUIDv7 (RFC 9562)
// whose first 48 bits are the current unix time in ms, then 12 bits that
// order the draws of one millisecond in this process, and 62 random bits
// from crypto/rand: an enroll's or attach's token is a bearer secret until
// its receipt expires (docs/PROTOCOL.md, Tokens are bearer secrets).
// Time-ordered tokens land next to each other in the server's token index,
// whose pages they fill (to the values bucket's 80%) instead of touching
// one at random per operation, and a server running a token window
// (docs/PROTOCOL.md, Token window) accepts no other kind: its
// window, and the refusal token_expired, count from the time the token
// was drawn, not from when it was sent.
func NewToken() Token {
	u, err := uuid.NewV7()
	if err != nil {
		// crypto/rand does not fail on supported platforms; a token that
		// is not random would break exact-retry deduplication.
		panic("client: uuid.NewV7: " + err.Error())
	}
	return Token(u)
}

// ParseToken parses the 32 hex digits of a token, as Token.String formats
// it. An all-zero token is refused: the protocol forbids it.
func ParseToken(s string) (Token, error) {
	var t Token
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(t) {
		return t, fmt.Errorf("client: token %q is not 32 hex digits", s)
	}
	copy(t[:], b)
	if t.IsZero() {
		return t, fmt.Errorf("client: token is all zero")
	}
	return t, nil
}

// Credential is what a participant presents to attach: its conversation,
// its id, the capability generation and the secret of that generation.
// Every attach replaces both Generation and Secret.
//
// Its JSON form is stable:
//
//	{"conversation":42,"participant":0,"generation":3,"secret":"<64 hex digits>"}
type Credential struct {
	Conversation uint64
	Participant  uint64
	Generation   uint64
	Secret       Secret
}

// String names the credential without its secret.
func (c Credential) String() string {
	return fmt.Sprintf("conversation %d participant %d generation %d", c.Conversation, c.Participant, c.Generation)
}

type credentialJSON struct {
	Conversation uint64 `json:"conversation"`
	Participant  uint64 `json:"participant"`
	Generation   uint64 `json:"generation"`
	Secret       string `json:"secret"`
}

// MarshalJSON encodes c in its stable JSON form, the secret in hex.
func (c Credential) MarshalJSON() ([]byte, error) {
	return json.Marshal(credentialJSON{c.Conversation, c.Participant, c.Generation, hex.EncodeToString(c.Secret[:])})
}

// UnmarshalJSON decodes the stable JSON form. The secret must be 64 hex
// digits and the generation at least 1.
func (c *Credential) UnmarshalJSON(b []byte) error {
	var j credentialJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("client: credential: %w", err)
	}
	s, err := hex.DecodeString(j.Secret)
	if err != nil || len(s) != len(c.Secret) {
		return fmt.Errorf("client: credential: secret is not %d hex digits", 2*len(c.Secret))
	}
	if j.Generation == 0 {
		return fmt.Errorf("client: credential: generation 0")
	}
	*c = Credential{Conversation: j.Conversation, Participant: j.Participant, Generation: j.Generation}
	copy(c.Secret[:], s)
	return nil
}

// key names a participant within a client.
type key struct{ conv, participant uint64 }

func (c Credential) key() key { return key{c.Conversation, c.Participant} }
