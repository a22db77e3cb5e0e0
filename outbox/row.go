package outbox

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/internal/versioned"
	"github.com/participantd/participantd/oplog"
)

// Version is the schema version byte that starts every outbox row written by
// this code.
const Version byte = 1

// RowKind is the kind of an outbox row.
type RowKind uint8

// Outbox row kinds.
const (
	// Produced carries the records an operation appended to the delivery
	// sequence, with their recipients.
	Produced RowKind = iota + 1
	// AckAdvanced carries a participant's new durable cursor.
	AckAdvanced
)

func (k RowKind) String() string {
	switch k {
	case Produced:
		return "produced"
	case AckAdvanced:
		return "ack_advanced"
	}
	return "rowkind(" + strconv.Itoa(int(k)) + ")"
}

// RecordKind is the kind of a record in the delivery sequence.
type RecordKind uint8

// Record kinds, with their protocol names.
const (
	KindRecord RecordKind = iota + 1
	KindJoined
	KindAttached
	KindDetached
	KindDied
	KindLeft
)

var recordKindNames = [...]string{"", "record", "joined", "attached", "detached", "died", "left"}

// String returns the protocol name of the kind.
func (k RecordKind) String() string {
	if int(k) < len(recordKindNames) && k != 0 {
		return recordKindNames[k]
	}
	return "recordkind(" + strconv.Itoa(int(k)) + ")"
}

// Record is one entry of a conversation's delivery sequence as the outbox
// stores it: the payload of a `record` stays in its oplog row.
type Record struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Seq         oplog.Seq
	Kind        RecordKind
	Participant oplog.ParticipantID // the record's subject
	Cause       oplog.Cause
	// Recipients are the members when the record committed, except its
	// subject, in ascending id order.
	Recipients []oplog.ParticipantID
}

// Addressed reports whether p is one of r's recipients.
func (r *Record) Addressed(p oplog.ParticipantID) bool {
	for _, q := range r.Recipients {
		if q == p {
			return true
		}
	}
	return false
}

// Row is one outbox row, derived from the oplog row at index Source.
type Row struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Kind RowKind
	// Source is the index of the oplog row this row derives from.
	Source uint64
	// Records are a Produced row's records, in ascending seq.
	Records []Record
	// Participant and Through are an AckAdvanced row's new cursor.
	Participant oplog.ParticipantID
	Through     oplog.Seq
}

// Errors of the codec and of validation.
var (
	// ErrUnknownVersion reports a row whose version byte is not Version.
	ErrUnknownVersion = errors.New("outbox: unknown schema version")
	// ErrMixedVersion reports a stream whose rows carry different versions.
	ErrMixedVersion = errors.New("outbox: mixed schema versions")
	// ErrCorrupt reports a row that does not decode or is not well formed.
	ErrCorrupt = errors.New("outbox: corrupt row")
)

// Encode returns the stored form of r: Version followed by its msgpack body.
// Encoding is deterministic.
func Encode(r *Row) ([]byte, error) {
	out, err := versioned.Encode(Version, r, sizeHint(r))
	if err != nil {
		return nil, fmt.Errorf("outbox: encode %v row: %w", r.Kind, err)
	}
	return out, nil
}

// sizeHint is about the length of r's encoding: a record costs its fixed
// fields and 18 bytes a recipient.
func sizeHint(r *Row) int {
	n := 64
	for i := range r.Records {
		n += 32 + 18*len(r.Records[i].Recipients)
	}
	return n
}

// Decode parses a stored row. Errors wrap ErrUnknownVersion or ErrCorrupt.
func Decode(b []byte) (Row, error) {
	var r Row
	if len(b) == 0 {
		return r, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if b[0] != Version {
		return r, fmt.Errorf("%w: %d", ErrUnknownVersion, b[0])
	}
	if err := checkBounds(b[1:]); err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if err := msgpack.Unmarshal(b[1:], &r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	switch r.Kind {
	case Produced:
		if len(r.Records) == 0 {
			return r, fmt.Errorf("%w: produced row without records", ErrCorrupt)
		}
	case AckAdvanced:
	default:
		return r, fmt.Errorf("%w: kind %d", ErrCorrupt, r.Kind)
	}
	return r, nil
}

// Stream returns the store stream holding conversation c's outbox.
func Stream(c oplog.ConversationID) string { return StreamPrefix + c.String() }

// StreamPrefix starts the name of every outbox stream.
const StreamPrefix = "outbox/"

// Validate checks a whole stored outbox stream before anything of it is
// trusted: every row's version is known, all rows share one version, every
// row decodes, and rows point at strictly increasing oplog rows. It returns
// the decoded rows. A mixed stream is reported as ErrMixedVersion even when
// one of its versions is unknown, since that is the more specific finding.
func Validate(payloads [][]byte) ([]Row, error) {
	var v Validator
	rows := make([]Row, 0, len(payloads))
	for _, b := range payloads {
		r, ok := v.Add(b)
		if v.Mixed() {
			break
		}
		if ok {
			rows = append(rows, r)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	return rows, nil
}
