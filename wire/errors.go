package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Sentinel errors. The typed errors below unwrap to them.
var (
	// ErrFrameTooLarge: a frame header announced a body longer than the
	// limit. The body was not read; the stream is no longer in sync and the
	// connection must close (the server answers rejected frame_too_large).
	ErrFrameTooLarge = errors.New("wire: frame too large")

	// ErrMalformed: the body is not one well-formed msgpack map with string
	// keys and a string "t", or a request has no integer "id". The
	// connection must close (the server answers rejected malformed).
	ErrMalformed = errors.New("wire: malformed message")

	// ErrBadRequest: the body is a well-formed message but "t" is unknown or
	// a field is missing, of the wrong type or of the wrong length. The
	// connection stays open; the server answers an error bad_request
	// carrying the request's id.
	ErrBadRequest = errors.New("wire: bad request")
)

// FrameTooLargeError reports a frame header announcing more than the limit.
// It unwraps to ErrFrameTooLarge.
type FrameTooLargeError struct {
	Length uint64 // the body length announced by the header, or to be written
	Max    uint64 // the limit in force
}

// Error returns the announced length and the limit, or, when the four
// header bytes are the start of another protocol (Peer), what the peer
// most likely is: a length of 1213486160 is "HTTP", the health listener
// answering a client that dialled the wrong port.
func (e *FrameTooLargeError) Error() string {
	switch e.Peer() {
	case PeerHTTPServer:
		return fmt.Sprintf("wire: the peer answered in HTTP, not the participantd protocol (header %q): the address is an HTTP listener, likely participantd's health listener (default port 7421), not its protocol listener (default 7420)", e.header())
	case PeerHTTPClient:
		return fmt.Sprintf("wire: the peer sent an HTTP request (%q), not the participantd protocol: HTTP goes to the health listener", e.header())
	case PeerTLS:
		return "wire: the peer speaks TLS, not the plain participantd protocol: connect with TLS (participantctl --tls-ca FILE)"
	}
	return fmt.Sprintf("wire: frame of %d bytes exceeds the limit of %d", e.Length, e.Max)
}

// Peer says what protocol the header's four bytes belong to, when they
// are not a participantd frame's length.
type Peer uint8

const (
	// PeerUnknown: a participantd frame too long for the limit, or bytes
	// of no protocol recognised here.
	PeerUnknown Peer = iota
	// PeerHTTPServer: "HTTP", the start of an HTTP response's status line.
	PeerHTTPServer
	// PeerHTTPClient: the start of an HTTP request line ("GET ", "POST", …).
	PeerHTTPClient
	// PeerTLS: a TLS record header (handshake or alert, TLS 1.0–1.3).
	PeerTLS
)

// Peer returns what protocol the header that announced Length belongs to.
// Only a header announcing more than the limit is looked at: a frame
// within the limit is a frame.
func (e *FrameTooLargeError) Peer() Peer {
	if e.Length <= e.Max || e.Length > math.MaxUint32 {
		return PeerUnknown
	}
	h := e.header()
	switch string(h[:]) {
	case "HTTP":
		return PeerHTTPServer
	case "GET ", "POST", "PUT ", "HEAD", "DELE", "OPTI", "PATC", "CONN", "PRI ":
		return PeerHTTPClient
	}
	if (h[0] == 0x15 || h[0] == 0x16) && h[1] == 0x03 && h[2] <= 0x04 {
		return PeerTLS
	}
	return PeerUnknown
}

func (e *FrameTooLargeError) header() [4]byte {
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], uint32(e.Length))
	return h
}

// Unwrap returns ErrFrameTooLarge.
func (e *FrameTooLargeError) Unwrap() error { return ErrFrameTooLarge }

// Class says what a decoding failure means for the connection.
type Class uint8

const (
	// Malformed closes the connection: rejected{reason:"malformed"}.
	Malformed Class = iota + 1
	// BadRequest keeps it open: {t:"error", id, code:"bad_request"}.
	BadRequest
)

// String returns the protocol's name for c: "malformed" or "bad_request".
func (c Class) String() string {
	switch c {
	case Malformed:
		return "malformed"
	case BadRequest:
		return "bad_request"
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// DecodeError reports a body that could not be decoded. It unwraps to
// ErrMalformed or ErrBadRequest according to Class.
//
// Type is the value of "t" once the body got far enough to have a string
// "t", else empty. So a Malformed error with a non-empty Type is a
// structurally valid map whose only fault is a missing or non-integer "id";
// a server that has not seen hello yet answers that with hello_required, as
// it does any non-hello type.
//
// HasID reports whether ID was read. It is always true for a BadRequest
// error of a request other than hello (a request without an id is
// Malformed); hello carries no id.
type DecodeError struct {
	Class  Class
	ID     uint64
	HasID  bool
	Type   string // the message type, when known
	Field  string // the offending key, when one is to blame
	Detail string // for people
}

// Error returns the class, type, id, field and detail that are known.
func (e *DecodeError) Error() string {
	b := make([]byte, 0, 64+len(e.Detail))
	b = append(b, "wire: "...)
	b = append(b, e.Class.String()...)
	if e.Type != "" {
		b = append(b, ' ')
		b = strconv.AppendQuote(b, e.Type)
	}
	if e.HasID {
		b = append(b, " id="...)
		b = strconv.AppendUint(b, e.ID, 10)
	}
	if e.Field != "" {
		b = append(b, " field "...)
		b = strconv.AppendQuote(b, e.Field)
	}
	b = append(b, ": "...)
	b = append(b, e.Detail...)
	return string(b)
}

// Unwrap returns ErrMalformed or ErrBadRequest.
func (e *DecodeError) Unwrap() error {
	if e.Class == BadRequest {
		return ErrBadRequest
	}
	return ErrMalformed
}

func malformed(format string, args ...any) *DecodeError {
	return &DecodeError{Class: Malformed, Detail: fmt.Sprintf(format, args...)}
}
