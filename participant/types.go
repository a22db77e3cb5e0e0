package participant

import (
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// The domain numbers, shared with the storage layers.
type (
	ConversationID = oplog.ConversationID
	ParticipantID  = oplog.ParticipantID
	Generation     = oplog.Generation
	Seq            = oplog.Seq
	Token          = oplog.Token
	ConnID         = oplog.ConnID
	Cause          = oplog.Cause
	RecordKind     = outbox.RecordKind
)

// Secret is a credential's 32-byte attach secret.
type Secret [32]byte

// Replay marks an answer that repeats an earlier commit instead of
// committing anything. The zero value marks a fresh answer.
type Replay string

// Replay markers, with their protocol names.
const (
	ReplayNone      Replay = ""
	ReplayBound     Replay = "bound"
	ReplayUnbound   Replay = "unbound"
	ReplayCommitted Replay = "committed"
)

// Enroll asks to create a participant in Conversation (creating the
// conversation on first use) and bind it to the calling connection.
type Enroll struct {
	Conversation ConversationID
	Token        Token
	// Invite is the invitation to Conversation (see MintInvite), required
	// under EnrollInvite and ignored under EnrollOpen.
	Invite []byte
}

// Attach presents a credential and asks for generation+1, a new secret and a
// binding on the calling connection.
type Attach struct {
	Conversation ConversationID
	Participant  ParticipantID
	Generation   Generation
	Secret       Secret
	Token        Token
}

// Tell appends a record with Payload to the conversation. The service
// keeps Payload, without a copy, as the record's payload in memory: the
// caller must not modify it once the operation has started (the server
// hands over each request's freshly decoded payload).
type Tell struct {
	Conversation ConversationID
	Participant  ParticipantID
	Generation   Generation
	Token        Token
	Payload      []byte
}

// Ack advances the participant's cursor to Through.
type Ack struct {
	Conversation ConversationID
	Participant  ParticipantID
	Generation   Generation
	Through      Seq
}

// Detach ends the participant's binding cleanly.
type Detach struct {
	Conversation ConversationID
	Participant  ParticipantID
	Generation   Generation
	Token        Token
}

// Leave retires the participant for good.
type Leave struct {
	Conversation ConversationID
	Participant  ParticipantID
	Generation   Generation
	Secret       Secret
	Token        Token
}

// Bound answers Enroll (`enrolled`) and Attach (`attached`).
type Bound struct {
	Conversation     ConversationID
	Participant      ParticipantID
	Generation       Generation
	Secret           Secret
	Cursor           Seq
	ReceiptExpiresAt time.Time
	Replay           Replay
}

// Told answers Tell.
type Told struct {
	Conversation ConversationID
	Seq          Seq
	Replay       Replay
}

// Acked answers Ack.
type Acked struct {
	Conversation ConversationID
	Participant  ParticipantID
	Cursor       Seq
	Noop         bool
}

// Ended answers Detach (`detached`) and Leave (`left`).
type Ended struct {
	Conversation ConversationID
	Participant  ParticipantID
	Seq          Seq
	Replay       Replay
}

// Delivery is one record offered to one bound recipient.
type Delivery struct {
	Conversation ConversationID
	Recipient    ParticipantID
	Seq          Seq
	Kind         RecordKind
	// Participant is the record's subject: the sender of a `record`, the
	// participant that joined, attached, detached, died or left.
	Participant ParticipantID
	// Payload is set for `record`; it is shared and must not be modified.
	Payload []byte
	// Cause is set for `detached` and `died`.
	Cause Cause
	// Epoch identifies the binding this delivery was offered through; hand
	// it back in Offered.
	Epoch Epoch
	// First, when set, makes this delivery a compacted notice instead of
	// a record: every record below First is gone, some addressed to
	// Recipient were released unacknowledged (Options.MaxUnackedAge), and
	// deliveries continue after Seq (First-1). Only Conversation,
	// Recipient, Seq, First and Epoch are set.
	First Seq
}

// Epoch identifies one binding: the connection that holds it and the
// generation it was created with.
type Epoch struct {
	Conn       ConnID
	Generation Generation
}

// Offered is what a connection already pushed to a binding: every record
// through Through. A zero Offered, or one of another epoch, means nothing.
type Offered struct {
	Epoch   Epoch
	Through Seq
}

// Code is a stable, machine-readable error code, the protocol's `code`.
// The server sends it as the wire.Code of the same value; every constant
// has its twin of the same name there (TestErrorCodes_OneList).
type Code string

// Error codes, with their protocol names.
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
	// CodeCompacted refuses an ack of a record the server released
	// unacknowledged (Options.MaxUnackedAge): First is the seq from which
	// records still exist; ack a delivered seq at or after it.
	CodeCompacted Code = "compacted"
	// CodeBacklogFull refuses an operation that adds records (enroll,
	// tell, attach) while its conversation, or the service, retains as
	// many records awaiting acknowledgement as it may (Limit); nothing
	// was done, and a retry with the same token may commit once
	// recipients acknowledge.
	CodeBacklogFull Code = "backlog_full"
	// CodeTokenExpired refuses, under a token window (Options.TokenWindow),
	// a token that is not committed and whose time is older than the
	// window (Oldest): whether an earlier send of it committed can no
	// longer be told, so nothing was done.
	CodeTokenExpired Code = "token_expired"
	// CodeTokenInvalid refuses, under a token window, a token that is not
	// a UUIDv7, or whose time is more than Options.TokenSkew ahead of the
	// server's clock (Newest).
	CodeTokenInvalid Code = "token_invalid"
	// CodeRateLimited refuses an enroll that would create a conversation
	// while its connection's CreateLimit refuses one more (Limit is the
	// burst); nothing was done, and a retry later with the same token may
	// commit.
	CodeRateLimited Code = "rate_limited"
)

// Sentinels, one per code, for errors.Is. Every *Error matches the sentinel
// of its code.
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
	ErrBacklogFull        = &Error{Code: CodeBacklogFull}
	ErrTokenExpired       = &Error{Code: CodeTokenExpired}
	ErrTokenInvalid       = &Error{Code: CodeTokenInvalid}
	ErrRateLimited        = &Error{Code: CodeRateLimited}
)

// Error is a refusal or failure of an operation, as the protocol's `error`
// answer carries it. Fields beyond Code and Detail are set only for the codes
// whose extras the protocol lists.
type Error struct {
	Code   Code
	Detail string
	// Generation is the current generation: for stale_authority only when
	// the presented secret verified (HasGeneration), for receipt_expired
	// always.
	Generation    Generation
	HasGeneration bool
	// Cursor is set for ack_gap and ack_regression.
	Cursor Seq
	// Limit is set for too_large, capacity_exceeded, backlog_full and
	// rate_limited.
	Limit uint64
	// First is set for compacted: the seq from which records exist.
	First Seq
	// Participant and Reason are set for receipt_expired; Reason is
	// "superseded" or "deadline".
	Participant ParticipantID
	Reason      string
	// Owner is set for moved: the owner's advertised address, empty when
	// no node owns the conversation at the moment.
	Owner string
	// Oldest is set for token_expired: the oldest token time (unix ms)
	// the conversation accepts now.
	Oldest int64
	// Newest is set for token_invalid when the token's time is ahead of
	// the server's clock: the newest token time (unix ms) accepted now; 0
	// when the token is not a UUIDv7.
	Newest int64
	// cause is the underlying failure of in_doubt and unavailable, for logs.
	cause error
}

func (e *Error) Error() string {
	msg := "participant: " + string(e.Code)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

// Is matches any *Error with the same code, so errors.Is(err,
// ErrStaleAuthority) holds for every stale-authority refusal.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// Unwrap returns the storage failure behind in_doubt or unavailable.
func (e *Error) Unwrap() error { return e.cause }

func refuse(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Unloadable describes a conversation that failed reconciliation and is
// contained: it answers unavailable and publishes nothing.
type Unloadable struct {
	Conversation ConversationID `json:"conversation_id"`
	// Class is stable and machine-readable: see the Class constants.
	Class  string `json:"class"`
	Reason string `json:"reason"`
}

// Classes of unloadable conversations.
const (
	ClassOplogCorrupt         = "oplog_corrupt"
	ClassOplogInconsistent    = "oplog_inconsistent"
	ClassOutboxUnknownVersion = "outbox_unknown_version"
	ClassOutboxMixedVersion   = "outbox_mixed_version"
	ClassOutboxCorrupt        = "outbox_corrupt"
	ClassOutboxConflict       = "outbox_conflict"
	ClassImpossibleBoundary   = "impossible_future_boundary"
	ClassStorageUnavailable   = "storage_unavailable"
)

// Backlog describes the records of loaded conversations that a recipient
// has yet to acknowledge (and those behind them, reclaimed in seq order).
type Backlog struct {
	// Records is how many records are retained: within
	// Options.BacklogRecords (see backpressure.go).
	Records int64
	// Conversations is how many loaded conversations retain at least one.
	Conversations int64
	// MemoryBytes is their payload bytes held in memory: brought back
	// within Options.MaxBacklogBytes after a commit passes it (unless every
	// large holder is busy), and never more than 5/4 of it plus the batch
	// being published (see backlog.go).
	MemoryBytes int64
	// EvictedBytes is their payload bytes dropped from memory, read back
	// from the oplog when delivered.
	EvictedBytes int64
	// EvictedTotal is the payload bytes ever dropped from memory.
	EvictedTotal int64
	// ConversationRefusals, ServerRefusals and ClientRefusals count the
	// operations refused backlog_full since Open, by the limit that
	// refused them: Options.MaxBacklogRecords, Options.BacklogRecords, or
	// a client's share of it (Options.ClientShare).
	ConversationRefusals int64
	ServerRefusals       int64
	ClientRefusals       int64
}
