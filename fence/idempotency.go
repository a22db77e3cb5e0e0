package fence

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// idempotencyTag versions the key derivation. It is NUL-terminated and
// NUL-free, so no domain can extend it.
const idempotencyTag = "participantd.fence.idempotency.v1\x00"

// IdempotencyKey derives the stable external-effect key of one site in one
// execution generation: lowercase hex of SHA-256 over the layout drawn in
// the package documentation.
//
// domain names what the ids identify (participantd uses "binding"); ids
// are fixed-width numbers in a fixed order, for a binding (conversation,
// participant, server incarnation, connection ordinal, capability
// generation). Attempts are deliberately absent, so every attempt and every
// redelivery of one generation shares its key, and a new execution
// generation gets a new key by construction: that is what makes the key fit
// to be the generationKey of Issue.
//
// The encoding is length-unambiguous: the domain is length-prefixed and each
// id takes exactly eight bytes, so distinct (domain, ids) never hash the
// same input. The caller owns ids; IdempotencyKey does not retain it.
func IdempotencyKey(domain string, ids ...uint64) string {
	h := sha256.New()
	h.Write([]byte(idempotencyTag))
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(domain)))
	h.Write(n[:])
	h.Write([]byte(domain))
	for _, id := range ids {
		binary.BigEndian.PutUint64(n[:], id)
		h.Write(n[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}
