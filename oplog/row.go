package oplog

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/internal/versioned"
)

// Version is the schema version byte that starts every oplog row written by
// this code.
const Version byte = 1

// Kind is the kind of a committed operation.
type Kind uint8

// Operation kinds. Genesis is the conversation's first row; End records the
// end of a binding that no client request ended (a lost connection, a clean
// goodbye, a drain, an unclean restart); Release records that the server
// gave up the records through Through, acknowledged or not (the bound on
// unacknowledged records' age), so that compaction may remove them;
// Delete ends a conversation whose participants have all left: it is the
// conversation's last row, nothing follows it, and the rows before it may
// all go (package participant, delete.go).
const (
	KindGenesis Kind = iota + 1
	KindEnroll
	KindAttach
	KindTell
	KindAck
	KindDetach
	KindLeave
	KindEnd
	KindRelease
	KindDelete
)

var kindNames = [...]string{"", "genesis", "enroll", "attach", "tell", "ack", "detach", "leave", "end", "release", "delete"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// HasToken reports whether rows of this kind carry a client token.
func (k Kind) HasToken() bool {
	switch k {
	case KindEnroll, KindAttach, KindTell, KindDetach, KindLeave:
		return true
	}
	return false
}

// HasToken reports whether r carries a client token: a row of a kind that
// does, except a Leave the operator committed (an eviction), which has
// none.
func (r *Row) HasToken() bool {
	return r.Kind.HasToken() && !(r.Kind == KindLeave && r.Cause == CauseEvicted)
}

// Row is one committed operation: its inputs and the positions the server
// allocated for it. It never holds a secret; secrets are derived from the
// node key and the row's positions (see package participant).
//
// Fields a kind does not use are zero. The msgpack encoding is an array in
// field order, so encoding the same Row always yields the same bytes.
type Row struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Kind Kind
	// Participant is the operation's subject; for Enroll, the minted id.
	Participant ParticipantID
	// Generation is the generation the operation ran under: 1 for Enroll,
	// the newly minted one for Attach, the binding's for the others.
	Generation Generation
	// Token is the client's token (zero for Genesis, Ack, End, Release and
	// Delete).
	Token Token
	// Conn is the connection incarnation of the binding an Enroll or Attach
	// created, or of the binding an End ended.
	Conn ConnID
	// Through is an Ack's new cursor, or the last seq a Release gives up.
	Through Seq
	// Seq is the seq of the operation's last record (0 for Genesis, Ack
	// and Release), kept so a replay answers `told`, `detached` and `left` without
	// reading the outbox.
	Seq Seq
	// Cursor is the participant's durable cursor when an Attach committed,
	// kept so a replay answers exactly what the original did.
	Cursor Seq
	// Cause is an End's cause; on a Leave, CauseEvicted or none.
	Cause Cause
	// At is the commit time in unix milliseconds (receipts expire from it).
	At int64
	// Nonce is the conversation's random salt, set on Genesis only.
	Nonce [16]byte
	// Payload is a Tell's payload, or, on an Enroll admitted by an invitation
	// with a use count, the invitation's 8-byte id (package participant).
	Payload []byte
}

// Errors of the codec.
var (
	// ErrUnknownVersion reports a row whose version byte this code does not
	// know.
	ErrUnknownVersion = errors.New("oplog: unknown schema version")
	// ErrCorrupt reports a row that does not decode.
	ErrCorrupt = errors.New("oplog: corrupt row")
)

// Encode returns the stored form of r: Version followed by its msgpack body.
func Encode(r *Row) ([]byte, error) {
	out, err := versioned.Encode(Version, r, maxFixedLen+len(r.Payload))
	if err != nil {
		return nil, fmt.Errorf("oplog: encode %v row: %w", r.Kind, err)
	}
	return out, nil
}

// maxFixedLen is about the most a row's encoding takes besides its
// payload's bytes: the version, the array header, the fixed-size fields
// at their widest and the payload's length prefix.
const maxFixedLen = 160

// Decode parses a stored row. Errors wrap ErrUnknownVersion or ErrCorrupt.
// The returned Row does not alias b.
func Decode(b []byte) (Row, error) {
	var r Row
	err := decodeInto(b, &r)
	return r, err
}

// DecodeReusing is Decode, but the Row's Payload is decoded into scratch's
// array when it fits there (and so is valid only until scratch is used
// again): a replay that drops each payload before the next row reads
// them all through one buffer instead of allocating each. It returns
// the scratch to pass next time, which holds the last payload's array.
func DecodeReusing(b, scratch []byte) (Row, []byte, error) {
	r := Row{Payload: scratch[:0]}
	if err := decodeInto(b, &r); err != nil {
		return Row{}, scratch, err
	}
	if cap(r.Payload) > cap(scratch) {
		scratch = r.Payload[:0]
	}
	return r, scratch, nil
}

// decodeInto decodes b into r, whose Payload's array msgpack reuses when
// the payload fits in it.
func decodeInto(b []byte, r *Row) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if b[0] != Version {
		return fmt.Errorf("%w: %d", ErrUnknownVersion, b[0])
	}
	if err := msgpack.Unmarshal(b[1:], r); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if r.Kind < KindGenesis || r.Kind > KindDelete {
		return fmt.Errorf("%w: kind %d", ErrCorrupt, r.Kind)
	}
	return nil
}

// Stream returns the store stream holding conversation c's oplog.
func Stream(c ConversationID) string { return "oplog/" + c.String() }
