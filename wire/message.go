package wire

import (
	"encoding/binary"
	"slices"
)

// Message is one protocol message: a pointer to one of the message structs
// of this package (the interface is sealed). Client→server: *Hello, *Enroll,
// *Attach, *Tell, *Ack, *Detach, *Leave, *Ping, *Bye. Server→client:
// *Welcome, *Rejected, *Enrolled, *Attached, *Told, *Acked, *Detached,
// *Left, *Pong, *Error, *Delivery, *Compacted, *ServerBye.
type Message interface {
	// Type returns the message's "t", one of the Type constants.
	Type() string
	// appendBody appends the message's msgpack body to b: a map whose keys
	// come in a fixed order ("t", then "id", then the protocol table's
	// order, then present optional fields), each value in its most compact
	// encoding, so that equal messages encode to equal bytes.
	appendBody(b []byte) []byte
}

// identified is implemented by every message that carries an id.
type identified interface {
	msgID() uint64
}

// ID returns the id m carries: a request's id, or the id an answer echoes.
// ok is false for messages without one (Hello, Welcome, Rejected, Delivery,
// Compacted, ServerBye).
func ID(m Message) (id uint64, ok bool) {
	if x, ok := m.(identified); ok {
		return x.msgID(), true
	}
	return 0, false
}

// Encode returns the msgpack body of m, without the frame header. Encoding
// is deterministic. Encode panics if m is nil.
func Encode(m Message) []byte { return m.appendBody(nil) }

// AppendEncode appends the msgpack body of m to dst and returns the
// extended slice.
func AppendEncode(dst []byte, m Message) []byte { return m.appendBody(dst) }

// AppendFrame appends the whole frame of m, header and body, to dst. It does
// not check the body length against any limit; see Writer for that. When
// dst has less room than such a frame usually takes, it is grown once
// first, not field by field as the body is appended.
func AppendFrame(dst []byte, m Message) []byte {
	dst = slices.Grow(dst, frameHint(m))
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = m.appendBody(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-HeaderLen))
	return dst
}

// frameHint is about the bytes m's frame takes: its payload, if it has
// one, and room for the fields of any frame without long strings (an
// acked with the largest numbers takes 90 bytes, a delivery or a tell 121
// besides its payload), so that a frame is allocated once and at about its
// size. A long string (an error's detail) grows the slice as it is
// appended.
func frameHint(m Message) int {
	const fields = 96
	switch m := m.(type) {
	case *Delivery:
		return fields + 32 + len(m.Payload)
	case *Tell:
		return fields + 32 + len(m.Payload)
	}
	return fields
}

// requestTypes and serverTypes are the types each decoder knows.
var (
	requestTypes = []string{TypeTell, TypeAck, TypeHello, TypeEnroll, TypeAttach,
		TypeDetach, TypeLeave, TypePing, TypeBye}
	serverTypes = []string{TypeDelivery, TypeTold, TypeAcked, TypeWelcome, TypeRejected,
		TypeEnrolled, TypeAttached, TypeDetached, TypeLeft, TypePong, TypeError, TypeBye, TypeCompacted}
)

// DecodeRequest decodes body, a frame body sent by a client, into one of
// *Hello, *Enroll, *Attach, *Tell, *Ack, *Detach, *Leave, *Ping or *Bye.
//
// The error is a *DecodeError. Class Malformed (errors.Is ErrMalformed):
// body is empty, not one msgpack map, has a non-string key, declares a
// length beyond its end, has trailing bytes, has no string "t", or is not
// hello and has no unsigned integer "id"; the server rejects and closes.
// Class BadRequest (errors.Is ErrBadRequest): "t" is unknown, or a field
// is missing, of the wrong type or length; ID carries the request's id
// (except for hello, which has none) and the connection stays open.
//
// The decoded message does not alias body: body may be reused at once.
// Hello is decoded like any request; refusing a hello that is not the
// first frame, or a first frame that is not hello, is the caller's job.
func DecodeRequest(body []byte) (Message, error) {
	var d decoder
	if err := d.scan(body); err != nil {
		return nil, err
	}
	typ, raw, err := d.typeName(requestTypes)
	if err != nil {
		return nil, err
	}
	if typ == TypeHello {
		d.typ = typ
		m := new(Hello)
		m.decode(&d)
		return result(m, &d)
	}
	d.typ = typ
	if typ == "" {
		d.typ = string(raw)
	}
	if err := d.readID(); err != nil {
		return nil, err
	}
	// Concrete calls, not an interface, keep d on the stack.
	switch typ {
	case TypeTell:
		m := &Tell{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeAck:
		m := &Ack{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeEnroll:
		m := &Enroll{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeAttach:
		m := &Attach{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeDetach:
		m := &Detach{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeLeave:
		m := &Leave{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypePing:
		return &Ping{ID: d.id}, nil
	case TypeBye:
		return &Bye{ID: d.id}, nil
	}
	d.fail(kT, "unknown request type")
	return nil, d.err
}

// DecodeServerMessage decodes body, a frame body sent by the server, into
// one of *Welcome, *Rejected, *Enrolled, *Attached, *Told, *Acked,
// *Detached, *Left, *Pong, *Error, *Delivery, *Compacted or *ServerBye.
//
// Errors are *DecodeError as for DecodeRequest: Malformed for a body that
// is not one well-formed map with a string "t", or an answer without an
// unsigned integer "id"; BadRequest for an unknown "t" (which a client may
// skip, for forward compatibility) or a bad field. Either means the server
// broke the protocol. The decoded message does not alias body.
func DecodeServerMessage(body []byte) (Message, error) {
	var d decoder
	if err := d.scan(body); err != nil {
		return nil, err
	}
	typ, raw, err := d.typeName(serverTypes)
	if err != nil {
		return nil, err
	}
	d.typ = typ
	if typ == "" {
		d.typ = string(raw)
	}
	switch typ {
	case TypeDelivery:
		m := new(Delivery)
		m.decode(&d)
		return result(m, &d)
	case TypeWelcome:
		m := new(Welcome)
		m.decode(&d)
		return result(m, &d)
	case TypeRejected:
		m := new(Rejected)
		m.decode(&d)
		return result(m, &d)
	case TypeBye:
		m := new(ServerBye)
		m.decode(&d)
		return result(m, &d)
	case TypeCompacted:
		m := new(Compacted)
		m.decode(&d)
		return result(m, &d)
	case "":
		d.fail(kT, "unknown server message type")
		return nil, d.err
	}
	// The rest answer a request and echo its id.
	if err := d.readID(); err != nil {
		return nil, err
	}
	switch typ {
	case TypeTold:
		m := &Told{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeAcked:
		m := &Acked{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeEnrolled:
		m := &Enrolled{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeAttached:
		m := &Attached{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeDetached:
		m := &Detached{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypeLeft:
		m := &Left{ID: d.id}
		m.decode(&d)
		return result(m, &d)
	case TypePong:
		return &Pong{ID: d.id}, nil
	}
	m := &Error{ID: d.id}
	m.decode(&d)
	return result(m, &d)
}

func result(m Message, d *decoder) (Message, error) {
	if d.err != nil {
		return nil, d.err
	}
	return m, nil
}

// Key-value appenders shared by the message encoders.

func kvUint(b []byte, k string, v uint64) []byte { return appendUint(appendStr(b, k), v) }
func kvStr(b []byte, k, v string) []byte         { return appendStr(appendStr(b, k), v) }
func kvBin(b []byte, k string, v []byte) []byte  { return appendBin(appendStr(b, k), v) }
func kvBool(b []byte, k string, v bool) []byte   { return appendBool(appendStr(b, k), v) }

// head appends the map header for n entries and "t".
func head(b []byte, n int, typ string) []byte { return kvStr(appendMapHeader(b, n), "t", typ) }

func count[T any](p *T) int {
	if p != nil {
		return 1
	}
	return 0
}
