package fence

import (
	"errors"
	"fmt"
)

// Sentinels for the three ways a completion is refused. A refusal is always
// a *RejectionError that unwraps to exactly one of them, so callers compare
// with errors.Is and read the site, when they need it, with errors.As.
var (
	// ErrMissingToken is a token that is absent: an empty wire value, or the
	// zero Token presented to Accept.
	ErrMissingToken = errors.New("fence: missing token")
	// ErrNoCurrentGeneration is a site with no generation at all: never
	// issued in this process, already consumed by an accepted completion,
	// revoked, or parked.
	ErrNoCurrentGeneration = errors.New("fence: no current generation")
	// ErrStaleGeneration is a site whose current generation does not hold
	// the presented token: it belongs to a superseded attempt or execution
	// generation, to a previous process, or was revoked by its own issuer.
	ErrStaleGeneration = errors.New("fence: stale generation")
)

// Reason says why a token was refused.
type Reason uint8

// The reasons a token is refused; each maps to one sentinel.
const (
	// MissingToken is ErrMissingToken.
	MissingToken Reason = iota + 1
	// NoCurrentGeneration is ErrNoCurrentGeneration.
	NoCurrentGeneration
	// StaleGeneration is ErrStaleGeneration.
	StaleGeneration
)

// String returns the reason in snake case, as it would be named on the wire.
func (r Reason) String() string {
	switch r {
	case MissingToken:
		return "missing_token"
	case NoCurrentGeneration:
		return "no_current_generation"
	case StaleGeneration:
		return "stale_generation"
	default:
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
}

// sentinel returns the ErrX that r stands for, or nil for an unknown reason.
func (r Reason) sentinel() error {
	switch r {
	case MissingToken:
		return ErrMissingToken
	case NoCurrentGeneration:
		return ErrNoCurrentGeneration
	case StaleGeneration:
		return ErrStaleGeneration
	default:
		return nil
	}
}

// RejectionError is a typed refusal of a token. It unwraps to the sentinel
// of its Reason, so errors.Is(err, ErrStaleGeneration) holds for a
// *RejectionError with Reason StaleGeneration.
type RejectionError struct {
	// Reason says why the token was refused.
	Reason Reason
	// Site is the execution-site key the refusal concerns (a K of the
	// Fences that refused it), or nil when there is none, as for ParseToken.
	Site any
}

// Error returns the sentinel's message, followed by the site when known.
func (e *RejectionError) Error() string {
	msg := "fence: " + e.Reason.String()
	if s := e.Reason.sentinel(); s != nil {
		msg = s.Error()
	}
	if e.Site == nil {
		return msg
	}
	return fmt.Sprintf("%s (site %v)", msg, e.Site)
}

// Unwrap returns the sentinel of e.Reason, or nil for an unknown reason.
func (e *RejectionError) Unwrap() error {
	return e.Reason.sentinel()
}

// reject builds the refusal of a token at site.
func reject(reason Reason, site any) error {
	return &RejectionError{Reason: reason, Site: site}
}
