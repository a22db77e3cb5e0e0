package wire

import "encoding/hex"

// Token is the 16-byte value a client chooses once per intended operation and
// reuses on every retry of it. On the wire it is a bin of exactly 16 bytes
// that are not all zero.
type Token [16]byte

// IsZero reports whether t is all zero, which the protocol refuses.
func (t Token) IsZero() bool { return t == Token{} }

// String returns t in hex.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// Secret is a participant's attach secret: a bin of exactly 32 bytes.
type Secret [32]byte

// String returns a fixed placeholder, never the secret, so that a Secret
// formatted into a log line does not leak.
func (Secret) String() string { return "Secret(redacted)" }
