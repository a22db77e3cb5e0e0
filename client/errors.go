package client

import (
	"errors"
	"fmt"

	"github.com/participantd/participantd/wire"
)

// Code is the machine-readable code of an error answer, as docs/PROTOCOL.md
// names it.
type Code = wire.Code

// Error codes, the protocol's.
const (
	CodeBadRequest         = wire.CodeBadRequest
	CodeUnknownParticipant = wire.CodeUnknownParticipant
	CodeRetired            = wire.CodeRetired
	CodeStaleAuthority     = wire.CodeStaleAuthority
	CodeNoBinding          = wire.CodeNoBinding
	CodeBindingOccupied    = wire.CodeBindingOccupied
	CodeTokenConflict      = wire.CodeTokenConflict
	CodeAckGap             = wire.CodeAckGap
	CodeAckRegression      = wire.CodeAckRegression
	CodeTooLarge           = wire.CodeTooLarge
	CodeCapacityExceeded   = wire.CodeCapacityExceeded
	CodeReceiptExpired     = wire.CodeReceiptExpired
	CodeInDoubt            = wire.CodeInDoubt
	CodeUnavailable        = wire.CodeUnavailable
	CodeShuttingDown       = wire.CodeShuttingDown
	CodeInviteRequired     = wire.CodeInviteRequired
	CodeInviteInvalid      = wire.CodeInviteInvalid
	CodeMoved              = wire.CodeMoved
	CodeBacklogFull        = wire.CodeBacklogFull
	// CodeTokenExpired: a server running a token window did not find the
	// token committed and its time (the time NewToken drew it) is older
	// than the window (Error.Oldest is the oldest token time it accepts
	// now, unix ms). Nothing was done, and whether an earlier send of
	// this token committed can no longer be told: the client does not
	// retry it, but for an attach. A caller that knows the first send did
	// not commit (it was never sent, or was refused with nothing done)
	// may send the operation again with a new token; one that does not
	// know must treat the outcome as unknown, as for in_doubt past its
	// retries (check the conversation's records, or give the operation
	// up). An attach (Attach, or a re-attachment after a reconnect) of a
	// token the client drew is retried once with a new token and the same
	// presented credential: had an earlier send committed, the retry is
	// refused stale_authority, so it never attaches twice. Its second
	// token_expired, or the first for a token of WithToken, loses the
	// participant (a *LostError).
	CodeTokenExpired = wire.CodeTokenExpired
	// CodeTokenInvalid: a server running a token window refused the token
	// because it is not a UUIDv7 (a token of WithToken not drawn by
	// NewToken, such as one an older client persisted), or because its
	// time is ahead of the server's clock by more than the server allows
	// (Error.Newest is the newest token time it accepts now, unix ms:
	// this machine's clock is ahead, or the server's behind). Nothing was
	// done, and the client does not retry it; fix the clock or the token.
	CodeTokenInvalid = wire.CodeTokenInvalid
	// CodeRateLimited: an Enroll that would create a conversation, while
	// this client's address creates them faster than the server allows
	// (Error.Limit is the burst). Nothing was done; retrying later with
	// the same token (WithToken) is safe.
	CodeRateLimited = wire.CodeRateLimited
)

// Error is an error answer of the server, or an outcome the client could not
// learn (Code in_doubt with Token set). Every *Error matches the sentinel of
// its code with errors.Is.
type Error struct {
	Code   Code
	Detail string

	// The extras, nil when the server sent none: Generation for
	// stale_authority (when the secret was right) and receipt_expired,
	// Cursor for ack_gap and ack_regression, Limit for too_large,
	// capacity_exceeded, backlog_full and rate_limited, Participant and Reason for
	// receipt_expired, Oldest for token_expired, Newest for token_invalid
	// of a token ahead of the server's clock (both unix ms).
	Generation  *uint64
	Cursor      *uint64
	Limit       *uint64
	Participant *uint64
	Reason      string
	Oldest      *uint64
	Newest      *uint64
	// Owner is, for moved, the owner node's address; empty when no node
	// owns the conversation at the moment. Cluster follows it.
	Owner string

	// Token is the operation's token when the outcome is unknown: retrying
	// with it (WithToken) learns the outcome without applying it twice.
	Token Token

	err error // the cause behind a client-side in_doubt, for Unwrap
}

// Error returns the code and detail.
func (e *Error) Error() string {
	s := "client: " + string(e.Code)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is matches any *Error with the same code, so errors.Is(err,
// ErrStaleAuthority) holds for every stale-authority refusal.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Unwrap returns what kept the client from learning an outcome (a context
// error), or nil.
func (e *Error) Unwrap() error { return e.err }

// Sentinels, one per code, for errors.Is.
var (
	ErrBadRequest         = &Error{Code: CodeBadRequest}
	ErrUnknownParticipant = &Error{Code: CodeUnknownParticipant}
	ErrRetired            = &Error{Code: CodeRetired}
	ErrStaleAuthority     = &Error{Code: CodeStaleAuthority}
	ErrNoBinding          = &Error{Code: CodeNoBinding}
	ErrBindingOccupied    = &Error{Code: CodeBindingOccupied}
	ErrTokenConflict      = &Error{Code: CodeTokenConflict}
	ErrAckGap             = &Error{Code: CodeAckGap}
	ErrAckRegression      = &Error{Code: CodeAckRegression}
	ErrTooLarge           = &Error{Code: CodeTooLarge}
	ErrCapacityExceeded   = &Error{Code: CodeCapacityExceeded}
	ErrReceiptExpired     = &Error{Code: CodeReceiptExpired}
	ErrInDoubt            = &Error{Code: CodeInDoubt}
	ErrUnavailable        = &Error{Code: CodeUnavailable}
	ErrShuttingDown       = &Error{Code: CodeShuttingDown}
	ErrInviteRequired     = &Error{Code: CodeInviteRequired}
	ErrInviteInvalid      = &Error{Code: CodeInviteInvalid}
	ErrMoved              = &Error{Code: CodeMoved}
	// ErrBacklogFull matches a backlog_full refusal, returned once
	// Options.BacklogWait of retries did not get the operation in:
	// nothing was done; retrying later with the same token (WithToken)
	// is safe.
	ErrBacklogFull = &Error{Code: CodeBacklogFull}
	// ErrTokenExpired matches a token_expired refusal (see
	// CodeTokenExpired): nothing was done now, but an earlier send of the
	// token may have committed.
	ErrTokenExpired = &Error{Code: CodeTokenExpired}
	// ErrTokenInvalid matches a token_invalid refusal (see
	// CodeTokenInvalid): nothing was done.
	ErrTokenInvalid = &Error{Code: CodeTokenInvalid}
	// ErrRateLimited matches a rate_limited refusal (see CodeRateLimited):
	// nothing was done.
	ErrRateLimited = &Error{Code: CodeRateLimited}
)

// Client-side errors.
var (
	// ErrClosed reports a call on a closed Client, or one cut short by Close.
	ErrClosed = errors.New("client: closed")
	// ErrConnectionLost reports a request without a token (Ping) whose
	// connection ended before its answer.
	ErrConnectionLost = errors.New("client: connection lost")
	// ErrRejected is what a *RejectedError unwraps to.
	ErrRejected = errors.New("client: connection rejected")
	// ErrProtocol reports a server that broke the protocol (an unexpected
	// answer type, an undecodable frame).
	ErrProtocol = errors.New("client: protocol violation by the server")
	// ErrParticipantLost reports a participant this client can no longer
	// use: its re-attachment was refused (the credential moved on, expired,
	// or the participant left). A *LostError carries the refusal.
	ErrParticipantLost = errors.New("client: participant lost")
	// ErrBindingSuperseded reports a participant whose binding on this
	// client ended elsewhere: another session attached it (a newer
	// generation), or the server no longer counts this connection as its
	// binding. A *LostError carries it with the refusal that showed it.
	ErrBindingSuperseded = errors.New("client: binding superseded by another session")
)

// RejectedError is the server's refusal of a connection (rejected).
type RejectedError struct {
	Reason wire.Reason
	Detail string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("client: connection rejected: %s: %s", e.Reason, e.Detail)
}

// Unwrap returns ErrRejected.
func (e *RejectedError) Unwrap() error { return ErrRejected }

// LostError reports a participant whose re-attachment was refused. It
// matches ErrParticipantLost and, through Err, the refusal's code sentinel
// (ErrReceiptExpired, ErrStaleAuthority, ErrRetired, ...).
type LostError struct {
	Conversation uint64
	Participant  uint64
	Err          error
}

func (e *LostError) Error() string {
	return fmt.Sprintf("client: participant %d of conversation %d lost: %v", e.Participant, e.Conversation, e.Err)
}

// Unwrap returns ErrParticipantLost and the refusal.
func (e *LostError) Unwrap() []error { return []error{ErrParticipantLost, e.Err} }

// fromWire converts an error answer.
func fromWire(m *wire.Error) *Error {
	e := &Error{
		Code:        m.Code,
		Detail:      m.Detail,
		Generation:  m.Generation,
		Cursor:      m.Cursor,
		Limit:       m.Limit,
		Participant: m.Participant,
		Oldest:      m.Oldest,
		Newest:      m.Newest,
	}
	if m.Reason != nil {
		e.Reason = *m.Reason
	}
	if m.Owner != nil {
		e.Owner = *m.Owner
	}
	return e
}
