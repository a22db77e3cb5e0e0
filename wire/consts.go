package wire

// Version is the protocol version this package speaks; hello.versions must
// contain it and welcome.version announces it.
const Version = 1

// MaxVersions is the longest hello.versions list a decoder accepts; a
// longer one is a field error (for hello, the server rejects it as
// malformed).
const MaxVersions = 256

// MaxInvite is the longest enroll.invite a decoder accepts; a longer one
// is a field error (bad_request). The server's invitations are 49 bytes.
const MaxInvite = 256

// DefaultMaxFrame is the default largest frame body, in bytes, a Reader
// accepts and a Writer sends: 1 MiB. The server announces its own limit in
// welcome.max_frame.
const DefaultMaxFrame = 1 << 20

// HeaderLen is the length of a frame header: a big-endian uint32 body length.
const HeaderLen = 4

// Message types: the value of key "t".
const (
	TypeHello    = "hello"
	TypeEnroll   = "enroll"
	TypeAttach   = "attach"
	TypeTell     = "tell"
	TypeAck      = "ack"
	TypeDetach   = "detach"
	TypeLeave    = "leave"
	TypePing     = "ping"
	TypeBye      = "bye" // both directions: a client request and a server push
	TypeWelcome  = "welcome"
	TypeRejected = "rejected"
	TypeEnrolled = "enrolled"
	TypeAttached = "attached"
	TypeTold     = "told"
	TypeAcked    = "acked"
	TypeDetached = "detached"
	TypeLeft     = "left"
	TypePong     = "pong"
	TypeError    = "error"
	TypeDelivery = "delivery"
	// TypeCompacted is a push: history below a seq no longer exists.
	TypeCompacted = "compacted"
)

// Reason is the reason of a rejected message. A rejected message is always
// followed by the server closing the connection.
type Reason string

// Rejection reasons.
const (
	ReasonUnsupportedVersion Reason = "unsupported_version"
	ReasonAuthFailed         Reason = "auth_failed"
	ReasonHelloRequired      Reason = "hello_required"
	ReasonMalformed          Reason = "malformed"
	ReasonFrameTooLarge      Reason = "frame_too_large"
	ReasonShuttingDown       Reason = "shutting_down"
	ReasonOverloaded         Reason = "overloaded"
)

// Code is the machine-readable code of an error answer. The connection stays
// open after an error answer. Its constants are participant.Code's, name for
// name and value for value, and the rows of docs/PROTOCOL.md's error table
// (TestErrorCodes_OneList).
type Code string

// Error codes.
const (
	CodeBadRequest         Code = "bad_request"
	CodeUnknownParticipant Code = "unknown_participant"
	CodeRetired            Code = "retired"
	CodeStaleAuthority     Code = "stale_authority"
	CodeNoBinding          Code = "no_binding"
	CodeBindingOccupied    Code = "binding_occupied"
	CodeTokenConflict      Code = "token_conflict"
	CodeAckGap             Code = "ack_gap"
	CodeAckRegression      Code = "ack_regression"
	CodeTooLarge           Code = "too_large"
	CodeCapacityExceeded   Code = "capacity_exceeded"
	CodeReceiptExpired     Code = "receipt_expired"
	CodeInDoubt            Code = "in_doubt"
	CodeUnavailable        Code = "unavailable"
	CodeShuttingDown       Code = "shutting_down"
	CodeInviteRequired     Code = "invite_required"
	CodeInviteInvalid      Code = "invite_invalid"
	// CodeMoved (cluster mode): another node owns the conversation;
	// nothing was done. Error.Owner names it when one does.
	CodeMoved Code = "moved"
	// CodeCompacted refuses an ack of a seq below the oldest record that
	// still exists; the error's First names that record.
	CodeCompacted Code = "compacted"
	// CodeBacklogFull refuses an enroll, tell or attach while the
	// conversation, or the server, retains as many records awaiting
	// acknowledgement as it may (the error's Limit); nothing was done, and
	// a retry with the same token commits once recipients acknowledge.
	CodeBacklogFull Code = "backlog_full"
	// CodeTokenExpired refuses, on a server running a token window
	// (docs/PROTOCOL.md, Token window), a request whose token is not
	// found committed and whose time is older than the window: the error's
	// Oldest is the oldest token time the server accepts now. Nothing was
	// done, and whether an earlier send of the token committed can no
	// longer be told.
	CodeTokenExpired Code = "token_expired"
	// CodeTokenInvalid refuses, on a server running a token window, a
	// request whose token is not a UUIDv7, or whose time is too far ahead
	// of the server's clock: then the error's Newest is the newest token
	// time the server accepts now. Nothing was done.
	CodeTokenInvalid Code = "token_invalid"
	// CodeRateLimited refuses an enroll that would create a conversation
	// while the client's address creates them faster than the server
	// allows (the error's Limit is the burst): nothing was done, and a
	// retry later with the same token may commit.
	CodeRateLimited Code = "rate_limited"
)

// Values of the reason extra of a receipt_expired error.
const (
	ExpiredSuperseded = "superseded" // a later attach exists
	ExpiredDeadline   = "deadline"   // receipt_ttl passed
)

// Reasons of the server's bye push (PROTOCOL.md, Pushes): why it is
// closing the connection.
const (
	// ByeShutdown: the server drains.
	ByeShutdown = "shutdown"
	// ByeIdle: the connection held no binding and sent nothing for the
	// server's idle timeout; the requests read before it were answered.
	ByeIdle = "idle"
	// ByeLeaseLost: a cluster node lost its lease while the connection
	// held a binding; every binding on it now belongs to whichever node
	// owns its conversation next (attach there, as after moved).
	ByeLeaseLost = "lease_lost"
)

// Kind is the kind of a delivered record.
type Kind string

// Delivery kinds.
const (
	KindRecord   Kind = "record"   // a tell payload; participant is the sender
	KindJoined   Kind = "joined"   // participant enrolled
	KindAttached Kind = "attached" // participant re-attached
	KindDetached Kind = "detached" // participant's binding ended; see Cause
	KindDied     Kind = "died"     // participant's binding ended; see Cause
	KindLeft     Kind = "left"     // participant left
)

// Cause is why a binding ended, carried by detached and died deliveries,
// or why a participant left, carried by a left delivery when the operator
// evicted it.
type Cause string

// Causes. The first three go with KindDetached, the next three with
// KindDied, CauseEvicted with KindLeft.
const (
	CauseClean          Cause = "clean"
	CauseSuperseded     Cause = "superseded"
	CauseShutdown       Cause = "shutdown"
	CauseConnectionLost Cause = "connection_lost"
	CauseProtocolError  Cause = "protocol_error"
	CauseUncleanRestart Cause = "unclean_restart"
	CauseEvicted        Cause = "evicted"
)

// Replay marks an answer that replays an already committed operation.
type Replay string

// Replay values.
const (
	ReplayBound     Replay = "bound"     // enroll/attach: the binding that answer created still holds
	ReplayUnbound   Replay = "unbound"   // enroll/attach: it does not
	ReplayCommitted Replay = "committed" // tell, detach, leave
)
