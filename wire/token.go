package wire

import (
	"encoding/binary"
	"encoding/hex"
)

// Token is the 16-byte value a client chooses once per intended operation and
// reuses on every retry of it. On the wire it is a bin of exactly 16 bytes
// that are not all zero.
//
// A server running a token window (docs/PROTOCOL.md, Token window)
// accepts only UUIDv7 tokens (RFC 9562), laid out as:
//
//	bits     field
//	0-47     unix_ts_ms: the unix time the token was drawn, ms, big-endian
//	48-51    version: 0111 (7)
//	52-63    rand_a: 12 bits
//	64-65    variant: 10
//	66-127   rand_b: 62 bits
type Token [16]byte

// IsZero reports whether t is all zero, which the protocol refuses.
func (t Token) IsZero() bool { return t == Token{} }

// String returns t in hex.
func (t Token) String() string { return hex.EncodeToString(t[:]) }

// MaxTokenMilli is the largest unix time, in ms, a UUIDv7 can carry.
const MaxTokenMilli = 1<<48 - 1

// TokenV7 returns the UUIDv7 token drawn at unixMilli whose 74 other bits
// are the low 12 bits of randA and the low 62 bits of randB; higher bits
// of each are ignored, as are those of unixMilli past MaxTokenMilli. The
// version and variant bits make it never zero. Uniqueness is the caller's:
// NewToken-style callers fill randA and randB at random.
func TokenV7(unixMilli int64, randA uint16, randB uint64) Token {
	var t Token
	ms := uint64(unixMilli) & MaxTokenMilli
	binary.BigEndian.PutUint64(t[0:8], ms<<16|0x7000|uint64(randA&0x0fff))
	binary.BigEndian.PutUint64(t[8:16], 0x8000_0000_0000_0000|randB&(1<<62-1))
	return t
}

// UnixMilli returns the time of a UUIDv7 token, in unix ms, and whether t
// is one (version 7, variant 10).
func (t Token) UnixMilli() (int64, bool) {
	if t[6]>>4 != 7 || t[8]>>6 != 0b10 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(t[0:8]) >> 16), true
}

// Secret is a participant's attach secret: a bin of exactly 32 bytes.
type Secret [32]byte

// String returns a fixed placeholder, never the secret, so that a Secret
// formatted into a log line does not leak.
func (Secret) String() string { return "Secret(redacted)" }
