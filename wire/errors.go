package wire

import (
	"errors"
	"fmt"
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

// Error returns the announced length and the limit.
func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("wire: frame of %d bytes exceeds the limit of %d", e.Length, e.Max)
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
