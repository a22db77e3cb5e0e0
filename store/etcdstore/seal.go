package etcdstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"unsafe"

	"github.com/participantd/participantd/store"
)

// Sealed values (format 1). Every value the store writes to etcd (stream
// entries, stream lengths, values, byte values) is its body followed by a
// trailer:
//
//	body | tag 0x01 (1 byte) | sum (4 bytes, big endian)
//
// where sum is the CRC-32C (Castagnoli) of the key relative to the root
// it is sealed under (the store's Prefix; cluster mode seals its own keys
// under the cluster prefix), a zero byte, the body and the tag. A value
// copied under another key does not verify there, and a bit flipped
// anywhere in a value fails its read. etcd keeps CRCs of its log and
// snapshots, not of a value once applied to its backend. The tag is not a
// digit, so a decimal or JSON reader of the format before sums (an older
// binary) refuses a sealed value instead of taking it for its body.
//
// Seal and Unseal are the one place the trailer is written and checked:
// every put of the store goes through Seal, every read of a value through
// Unseal, and compares of a value in a transaction compare its sealed
// bytes (the trailer is a function of the key and body).
const (
	sealTag = 0x01
	// runTag marks a run of stream entries (runs.go): its body is the
	// run's encoding, not a payload. A reader of format 1 refuses it as a
	// tag it does not know.
	runTag = 0x02
	// SealOverhead is the trailer's size: what sealing adds to a value.
	SealOverhead = 5
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealSep is the byte between key and body, as the sum reads it (never
// written).
var sealSep = [1]byte{0}

func sealSum(rel string, body []byte, tag byte) uint32 {
	// The key is read in place: crc32 only reads its argument, and a
	// conversion of the string would allocate once per value.
	sum := crc32.Update(0, castagnoli, unsafe.Slice(unsafe.StringData(rel), len(rel)))
	sum = crc32.Update(sum, castagnoli, sealSep[:])
	sum = crc32.Update(sum, castagnoli, body)
	t := [1]byte{tag}
	return crc32.Update(sum, castagnoli, t[:])
}

// appendSealed appends body sealed under rel with tag to dst.
func appendSealed(dst []byte, rel string, body []byte, tag byte) []byte {
	dst = append(dst, body...)
	return binary.BigEndian.AppendUint32(append(dst, tag), sealSum(rel, body, tag))
}

// Seal returns body sealed under rel, the key relative to its root, as
// the string a put sends.
func Seal(rel string, body []byte) string {
	var b strings.Builder
	b.Grow(len(body) + SealOverhead)
	b.Write(body)
	var t [SealOverhead]byte
	t[0] = sealTag
	binary.BigEndian.PutUint32(t[1:], sealSum(rel, body, sealTag))
	b.Write(t[:])
	return b.String()
}

// Unseal returns the body of sealed, a value stored at rel (the key
// relative to its root), or a *store.ChecksumError (errors.Is
// store.ErrCorrupt) naming root and rel when its trailer is missing or
// does not match. A run of stream entries (tag 0x02) verifies too; its
// body is the run's encoding. The body is a sub-slice of sealed.
func Unseal(root, rel string, sealed []byte) ([]byte, error) {
	body, _, err := unsealTag(root, rel, sealed)
	return body, err
}

// unsealTag is Unseal that also returns the trailer's tag (sealTag or
// runTag).
func unsealTag(root, rel string, sealed []byte) ([]byte, byte, error) {
	n := len(sealed) - SealOverhead
	if n < 0 {
		return nil, 0, &store.ChecksumError{File: "etcd " + root, Key: fmt.Sprintf("%q", rel),
			What: fmt.Sprintf("%d bytes, shorter than the %d-byte checksum trailer", len(sealed), SealOverhead)}
	}
	body, tag := sealed[:n], sealed[n]
	if tag != sealTag && tag != runTag {
		return nil, 0, &store.ChecksumError{File: "etcd " + root, Key: fmt.Sprintf("%q", rel),
			What: fmt.Sprintf("trailer tag %#x, want %#x or %#x", tag, sealTag, runTag)}
	}
	stored, computed := binary.BigEndian.Uint32(sealed[n+1:]), sealSum(rel, body, tag)
	if stored != computed {
		return nil, 0, &store.ChecksumError{File: "etcd " + root, Key: fmt.Sprintf("%q", rel),
			What: fmt.Sprintf("checksum %08x stored, %08x computed", stored, computed)}
	}
	return body, tag, nil
}

// seal returns body sealed under key, a key of the store's prefix.
func (s *Store) seal(key string, body []byte) string {
	return Seal(key[len(s.lay.prefix):], body)
}

// unseal returns the body of sealed, the value of key (a key of the
// store's prefix), or a *store.ChecksumError.
func (s *Store) unseal(key string, sealed []byte) ([]byte, error) {
	body, tag, err := unsealTag(s.lay.prefix, key[len(s.lay.prefix):], sealed)
	if err == nil && tag != sealTag {
		// A run where a single value belongs: never taken for one.
		return nil, &store.ChecksumError{File: "etcd " + s.lay.prefix, Key: fmt.Sprintf("%q", key[len(s.lay.prefix):]),
			What: fmt.Sprintf("trailer tag %#x, want %#x", tag, sealTag)}
	}
	return body, err
}

// sealU64 returns v in the layout's 8-byte encoding, sealed under key.
func (s *Store) sealU64(key string, v uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return s.seal(key, b[:])
}

// unsealU64 returns the value held by sealed, stored at key: a
// *store.ChecksumError when it does not verify, ErrCorrupt when its body
// is not 8 bytes.
func (s *Store) unsealU64(key string, sealed []byte) (uint64, error) {
	body, err := s.unseal(key, sealed)
	if err != nil {
		return 0, err
	}
	v, ok := decodeU64(body)
	if !ok {
		return 0, fmt.Errorf("%w: %w: key %q holds %d bytes, want 8", store.ErrCorrupt, ErrCorrupt, key, len(body))
	}
	return v, nil
}
