package wire

import "fmt"

// key indexes the keys this package knows, across all message types. A key
// unknown to the message's type is located but never read, so it is ignored
// as the protocol requires.
type key uint8

const (
	kT key = iota
	kID
	kVersions
	kAuth
	kClient
	kConversation
	kParticipant
	kGeneration
	kSecret
	kToken
	kPayload
	kThrough
	kVersion
	kServer
	kIncarnation
	kConnection
	kMaxFrame
	kMaxRecordBytes
	kReason
	kDetail
	kCursor
	kReceiptExpiresAt
	kReplay
	kSeq
	kNoop
	kCode
	kLimit
	kRecipient
	kKind
	kCause
	kNode
	kOwner
	kInvite
	kFirst
	kOldest
	kNewest
	kTokenWindow
	kTokenSkew
	numKeys
)

var keyNames = [numKeys]string{
	kT:                "t",
	kID:               "id",
	kVersions:         "versions",
	kAuth:             "auth",
	kClient:           "client",
	kConversation:     "conversation",
	kParticipant:      "participant",
	kGeneration:       "generation",
	kSecret:           "secret",
	kToken:            "token",
	kPayload:          "payload",
	kThrough:          "through",
	kVersion:          "version",
	kServer:           "server",
	kIncarnation:      "incarnation",
	kConnection:       "connection",
	kMaxFrame:         "max_frame",
	kMaxRecordBytes:   "max_record_bytes",
	kReason:           "reason",
	kDetail:           "detail",
	kCursor:           "cursor",
	kReceiptExpiresAt: "receipt_expires_at",
	kReplay:           "replay",
	kSeq:              "seq",
	kNoop:             "noop",
	kCode:             "code",
	kLimit:            "limit",
	kRecipient:        "recipient",
	kKind:             "kind",
	kCause:            "cause",
	kNode:             "node",
	kOwner:            "owner",
	kInvite:           "invite",
	kFirst:            "first",
	kOldest:           "oldest",
	kNewest:           "newest",
	kTokenWindow:      "token_window",
	kTokenSkew:        "token_skew",
}

// lookupKey maps a key's bytes to its index without allocating.
func lookupKey(s []byte) (key, bool) {
	switch string(s) {
	case "t":
		return kT, true
	case "id":
		return kID, true
	case "versions":
		return kVersions, true
	case "auth":
		return kAuth, true
	case "client":
		return kClient, true
	case "conversation":
		return kConversation, true
	case "participant":
		return kParticipant, true
	case "generation":
		return kGeneration, true
	case "secret":
		return kSecret, true
	case "token":
		return kToken, true
	case "payload":
		return kPayload, true
	case "through":
		return kThrough, true
	case "version":
		return kVersion, true
	case "server":
		return kServer, true
	case "incarnation":
		return kIncarnation, true
	case "connection":
		return kConnection, true
	case "max_frame":
		return kMaxFrame, true
	case "max_record_bytes":
		return kMaxRecordBytes, true
	case "reason":
		return kReason, true
	case "detail":
		return kDetail, true
	case "cursor":
		return kCursor, true
	case "receipt_expires_at":
		return kReceiptExpiresAt, true
	case "replay":
		return kReplay, true
	case "seq":
		return kSeq, true
	case "noop":
		return kNoop, true
	case "code":
		return kCode, true
	case "limit":
		return kLimit, true
	case "recipient":
		return kRecipient, true
	case "kind":
		return kKind, true
	case "cause":
		return kCause, true
	case "node":
		return kNode, true
	case "owner":
		return kOwner, true
	case "invite":
		return kInvite, true
	case "first":
		return kFirst, true
	case "oldest":
		return kOldest, true
	case "newest":
		return kNewest, true
	case "token_window":
		return kTokenWindow, true
	case "token_skew":
		return kTokenSkew, true
	}
	return 0, false
}

// decoder holds one body after scan: where each known key's value starts,
// and the first field error met while reading them.
type decoder struct {
	body  []byte
	at    [numKeys]int32 // offset+1 of the value of the key's last occurrence; 0: absent
	typ   string
	id    uint64
	hasID bool
	err   *DecodeError
}

// scan checks that body is exactly one msgpack map with string keys, every
// declared length within the body, and nothing after it; it records where
// the known keys' values are. A key that occurs twice takes its last value,
// as a generic decoder into a dictionary would.
func (d *decoder) scan(body []byte) *DecodeError {
	d.body = body
	if len(body) == 0 {
		return malformed("empty body")
	}
	if len(body) > 1<<31-1 {
		return malformed("body of %d bytes is too long", len(body))
	}
	n, i, ok := readMapHeader(body)
	if !ok {
		return malformed("body is not a msgpack map (first byte 0x%02x)", body[0])
	}
	if left := uint64(len(body) - i); n > left/2 {
		return malformed("map declares %d entries, %d bytes left", n, left)
	}
	for ; n > 0; n-- {
		ks := i
		ke, err := skipValue(body, ks)
		if err != nil {
			return err
		}
		name, _, ok := readStr(body, ks)
		if !ok {
			return malformed("offset %d: non-string key (type byte 0x%02x)", ks, body[ks])
		}
		vs := ke
		i, err = skipValue(body, vs)
		if err != nil {
			return err
		}
		if k, ok := lookupKey(name); ok {
			d.at[k] = int32(vs) + 1
		}
	}
	if i != len(body) {
		return malformed("%d trailing bytes after the map", len(body)-i)
	}
	return nil
}

// typeName reads "t". It returns the matching constant, so known types cost
// no allocation, and the raw bytes for an unknown one.
func (d *decoder) typeName(names []string) (string, []byte, *DecodeError) {
	off := d.at[kT]
	if off == 0 {
		return "", nil, malformed(`no key "t"`)
	}
	s, _, ok := readStr(d.body, int(off-1))
	if !ok {
		return "", nil, malformed(`"t" is not a string`)
	}
	for _, name := range names {
		if string(s) == name {
			return name, s, nil
		}
	}
	return "", s, nil
}

// readID reads "id"; a missing or non-integer id is Malformed.
func (d *decoder) readID() *DecodeError {
	off := d.at[kID]
	if off == 0 {
		return &DecodeError{Class: Malformed, Type: d.typ, Field: "id", Detail: "missing"}
	}
	v, ok := readUint(d.body, int(off-1))
	if !ok {
		return &DecodeError{Class: Malformed, Type: d.typ, Field: "id", Detail: "not an unsigned integer"}
	}
	d.id, d.hasID = v, true
	return nil
}

func (d *decoder) fail(k key, format string, args ...any) {
	if d.err != nil {
		return
	}
	d.err = &DecodeError{
		Class:  BadRequest,
		ID:     d.id,
		HasID:  d.hasID,
		Type:   d.typ,
		Field:  keyNames[k],
		Detail: fmt.Sprintf(format, args...),
	}
}

// value returns the offset of k's value; present is false when k is absent
// or, for optional keys, nil (a nil optional field reads as absent).
func (d *decoder) value(k key, optional bool) (int, bool) {
	if d.err != nil {
		return 0, false
	}
	off := int(d.at[k]) - 1
	if off < 0 {
		if !optional {
			d.fail(k, "missing")
		}
		return 0, false
	}
	if optional && d.body[off] == mpNil {
		return 0, false
	}
	return off, true
}

func (d *decoder) uint(k key) uint64 {
	off, ok := d.value(k, false)
	if !ok {
		return 0
	}
	v, ok := readUint(d.body, off)
	if !ok {
		d.fail(k, "not an unsigned integer")
	}
	return v
}

func (d *decoder) optUint(k key) *uint64 {
	off, ok := d.value(k, true)
	if !ok {
		return nil
	}
	v, ok := readUint(d.body, off)
	if !ok {
		d.fail(k, "not an unsigned integer")
		return nil
	}
	return &v
}

func (d *decoder) bool(k key) bool {
	off, ok := d.value(k, false)
	if !ok {
		return false
	}
	v, ok := readBool(d.body, off)
	if !ok {
		d.fail(k, "not a boolean")
	}
	return v
}

func (d *decoder) strBytes(k key, optional bool) ([]byte, bool) {
	off, ok := d.value(k, optional)
	if !ok {
		return nil, false
	}
	s, _, ok := readStr(d.body, off)
	if !ok {
		d.fail(k, "not a string")
		return nil, false
	}
	return s, true
}

func (d *decoder) str(k key) string {
	s, _ := d.strBytes(k, false)
	return string(s)
}

func (d *decoder) optStr(k key) *string {
	s, ok := d.strBytes(k, true)
	if !ok {
		return nil
	}
	v := string(s)
	return &v
}

// bin returns the bin value of k, aliasing the body.
func (d *decoder) bin(k key, optional bool) ([]byte, bool) {
	off, ok := d.value(k, optional)
	if !ok {
		return nil, false
	}
	p, ok := readBin(d.body, off)
	if !ok {
		d.fail(k, "not a bin")
		return nil, false
	}
	return p, true
}

// payload returns a copy of the bin value of k: decoded messages never
// alias the body. A present empty bin is a non-nil empty slice; absent is nil.
func (d *decoder) payload(k key, optional bool) []byte {
	p, ok := d.bin(k, optional)
	if !ok {
		return nil
	}
	if len(p) == 0 {
		return []byte{}
	}
	return append([]byte(nil), p...)
}

func (d *decoder) token(k key) Token {
	var t Token
	p, ok := d.bin(k, false)
	if !ok {
		return t
	}
	if len(p) != len(t) {
		d.fail(k, "%d bytes, want %d", len(p), len(t))
		return t
	}
	copy(t[:], p)
	if t.IsZero() {
		d.fail(k, "all zero")
	}
	return t
}

func (d *decoder) secret(k key) Secret {
	var s Secret
	p, ok := d.bin(k, false)
	if !ok {
		return s
	}
	if len(p) != len(s) {
		d.fail(k, "%d bytes, want %d", len(p), len(s))
		return s
	}
	copy(s[:], p)
	return s
}

func (d *decoder) uintArray(k key) []uint64 {
	off, ok := d.value(k, false)
	if !ok {
		return nil
	}
	n, i, ok := readArrayHeader(d.body, off)
	if !ok {
		d.fail(k, "not an array")
		return nil
	}
	// A version list longer than this is no real client's: refusing it
	// keeps a 1 MiB frame of fixints from costing 8 MiB of uint64s.
	if n > MaxVersions {
		d.fail(k, "%d elements, at most %d", n, MaxVersions)
		return nil
	}
	// Check the elements before allocating; n is at most the bytes left,
	// skipValue checked it.
	start := i
	for j := range n {
		if _, ok := readUint(d.body, i); !ok {
			d.fail(k, "element %d is not an unsigned integer", j)
			return nil
		}
		i, _ = skipValue(d.body, i)
	}
	vs := make([]uint64, n)
	i = start
	for j := range vs {
		vs[j], _ = readUint(d.body, i)
		i, _ = skipValue(d.body, i)
	}
	return vs
}
