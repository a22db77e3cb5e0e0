package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// Versions of a checkpoint, its first byte.
const (
	// Version1 is a checkpoint without Released or Invites.
	Version1 byte = 1
	// Version2 adds Released.
	Version2 byte = 2
	// Version3 adds Invites.
	Version3 byte = 3
	// Version4 names where the retained records are stored (Window)
	// instead of holding a copy of each.
	Version4 byte = 4
)

// KeyPrefix starts the key of every checkpoint.
const KeyPrefix = "checkpoint/"

// Key is the key of conversation c's checkpoint.
func Key(c oplog.ConversationID) string { return KeyPrefix + c.String() }

// ErrCorrupt: the bytes are not a well-formed checkpoint of a known
// version, in its one encoding.
var ErrCorrupt = errors.New("checkpoint: corrupt")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Checkpoint is a conversation's state after its first Index oplog rows.
type Checkpoint struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	// Conversation is the conversation the checkpoint belongs to.
	Conversation oplog.ConversationID
	// Index is the number of oplog rows covered (outbox.State.Applied);
	// Produced the outbox rows they produced.
	Index    uint64
	Produced uint64
	Nonce    [16]byte
	LastSeq  oplog.Seq
	Members  []Member
	// Records are the unreclaimed records, in seq order, in Versions 1
	// to 3; a Version4 checkpoint has none and a Window instead.
	Records []Record
	// OplogDigest is the SHA-256 of stored oplog row Index-1; OutboxDigest
	// of outbox row Produced-1 (zero when Produced is 0).
	OplogDigest  [32]byte
	OutboxDigest [32]byte
	// Marks are compaction marks, oldest first.
	Marks []Mark
	// Released lists, by member, the members a Release gave up records
	// of above their cursor (outbox.Member.Released), while their cursor
	// is below it; encoded from Version2 on.
	Released []Released `msgpack:"-"`
	// Invites are the uses of invitations with a use count
	// (outbox.State.InviteUses), by id ascending; encoded in Version3
	// and Version4.
	Invites []Invite `msgpack:"-"`
	// Window, set in Version4 only, says where the unreclaimed records
	// are stored instead of Records.
	Window *Window `msgpack:"-"`
}

// Window says where a Version4 checkpoint's unreclaimed records are: the
// records First..LastSeq, every one of them in a `produced` row of the
// outbox rows Outbox..Produced-1, the row Outbox being the one that
// produced First, from oplog row Oplog. A checkpoint retaining no record
// has First LastSeq+1, Oplog Index and Outbox Produced. Each record's
// payload, for a `record`, is in the oplog row its outbox row names as
// its source. The rows stay stored while the records are retained:
// compaction trims only below a mark, and marks stand at or below the
// first retained record's rows.
type Window struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	First  oplog.Seq
	Oplog  uint64
	Outbox uint64
}

// Member is one participant's outbox.Member, without its release.
type Member struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Generation    oplog.Generation
	Retired       bool
	Cursor        oplog.Seq
	Bound         bool
	Conn          oplog.ConnID
	BindingSource uint64
}

// Record is an unreclaimed record with the positions of the rows that
// produced it: its payload, for a `record`, is in oplog row Oplog.
type Record struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Record outbox.Record
	Oplog  uint64
	Outbox uint64
}

// Mark says that from time At (unix ms) on, every record produced by
// oplog rows below Oplog (outbox rows below Outbox) was reclaimed: every
// recipient acknowledged it or left. Compaction removes rows below the
// newest mark older than its retention.
type Mark struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	At     int64
	Oplog  uint64
	Outbox uint64
}

// Released is one member's outbox.Member.Released.
type Released struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Member  oplog.ParticipantID
	Through oplog.Seq
}

// Invite is one invitation's uses.
type Invite struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	ID   uint64
	Uses uint32
}

// withReleased is the body of a Version2 checkpoint.
type withReleased struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Checkpoint *Checkpoint
	Released   []Released
}

// withInvites is the body of a Version3 checkpoint.
type withInvites struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Checkpoint *Checkpoint
	Released   []Released
	Invites    []Invite
}

// withWindow is the body of a Version4 checkpoint.
type withWindow struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Checkpoint *Checkpoint
	Released   []Released
	Invites    []Invite
	Window     *Window
}

// errWindowAndRecords: a checkpoint names its records' rows or holds
// them, not both.
var errWindowAndRecords = errors.New("checkpoint: a checkpoint with a window holds no records")

// encodeBody returns ck's version and msgpack body.
func (ck *Checkpoint) encodeBody() (byte, []byte, error) {
	if ck.Window != nil {
		if len(ck.Records) > 0 {
			return Version4, nil, errWindowAndRecords
		}
		body, err := msgpack.Marshal(&withWindow{Checkpoint: ck, Released: ck.Released, Invites: ck.Invites, Window: ck.Window})
		return Version4, body, err
	}
	if len(ck.Invites) > 0 {
		body, err := msgpack.Marshal(&withInvites{Checkpoint: ck, Released: ck.Released, Invites: ck.Invites})
		return Version3, body, err
	}
	if len(ck.Released) == 0 {
		body, err := msgpack.Marshal(ck)
		return Version1, body, err
	}
	body, err := msgpack.Marshal(&withReleased{Checkpoint: ck, Released: ck.Released})
	return Version2, body, err
}

// Encode returns the stored form of ck, in a new slice: Version4 when ck
// has a Window, else the oldest version that holds it. It does not check
// that ck is well formed.
func Encode(ck *Checkpoint) ([]byte, error) {
	version, body, err := ck.encodeBody()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encode: %w", err)
	}
	out := make([]byte, 0, 1+len(body)+4)
	out = append(out, version)
	out = append(out, body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(body, crcTable)), nil
}

// Decode parses and checks a stored checkpoint: version, CRC, a body that
// re-encodes to exactly itself, and WellFormed. Errors wrap ErrCorrupt;
// the checkpoint shares no memory with b.
func Decode(b []byte) (*Checkpoint, error) {
	if len(b) < 1+4 {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	if b[0] < Version1 || b[0] > Version4 {
		return nil, fmt.Errorf("%w: unknown version %d", ErrCorrupt, b[0])
	}
	body := b[1 : len(b)-4]
	if got, want := crc32.Checksum(body, crcTable), binary.BigEndian.Uint32(b[len(b)-4:]); got != want {
		return nil, fmt.Errorf("%w: crc %08x, stored %08x", ErrCorrupt, got, want)
	}
	ck := &Checkpoint{}
	var err error
	switch b[0] {
	case Version1:
		err = msgpack.Unmarshal(body, ck)
	case Version2:
		w := withReleased{Checkpoint: ck}
		err = msgpack.Unmarshal(body, &w)
		ck.Released = w.Released
	case Version3:
		w := withInvites{Checkpoint: ck}
		err = msgpack.Unmarshal(body, &w)
		ck.Released, ck.Invites = w.Released, w.Invites
	default:
		w := withWindow{Checkpoint: ck}
		err = msgpack.Unmarshal(body, &w)
		ck.Released, ck.Invites, ck.Window = w.Released, w.Invites, w.Window
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	// Encoded again, a version 2 body without releases is version 1's, a
	// version 4 body without a window another version's, and one without
	// a checkpoint holds the zero checkpoint: none is canonical.
	if version, again, err := ck.encodeBody(); err != nil || version != b[0] || !bytes.Equal(again, body) {
		return nil, fmt.Errorf("%w: body is not in canonical form", ErrCorrupt)
	}
	if err := ck.WellFormed(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return ck, nil
}

// WellFormed checks what a checkpoint must satisfy on its own, so that
// nothing later indexes out of range or trusts an impossible state; it
// returns the first violation found.
func (ck *Checkpoint) WellFormed() error {
	if ck.Index == 0 {
		return errors.New("covers no row")
	}
	n := uint64(len(ck.Members))
	for i, m := range ck.Members {
		switch {
		case m.Generation == 0:
			return fmt.Errorf("member %d has generation 0", i)
		case m.Cursor > ck.LastSeq:
			return fmt.Errorf("member %d cursor %v past the last seq %v", i, m.Cursor, ck.LastSeq)
		case m.Bound && (m.Conn.IsZero() || m.Retired || m.BindingSource >= ck.Index):
			return fmt.Errorf("member %d has an impossible binding", i)
		case !m.Bound && !m.Conn.IsZero():
			return fmt.Errorf("member %d has a connection but no binding", i)
		}
	}
	for k, r := range ck.Records {
		rec := &r.Record
		switch {
		case rec.Seq == 0 || (k > 0 && rec.Seq != ck.Records[k-1].Record.Seq+1):
			return fmt.Errorf("record %d has seq %v, records are not contiguous", k, rec.Seq)
		case rec.Kind < outbox.KindRecord || rec.Kind > outbox.KindLeft:
			return fmt.Errorf("record %v has kind %d", rec.Seq, rec.Kind)
		case uint64(rec.Participant) >= n:
			return fmt.Errorf("record %v names %v, of %d members", rec.Seq, rec.Participant, n)
		case r.Oplog == 0 || r.Oplog >= ck.Index || r.Outbox >= ck.Produced:
			return fmt.Errorf("record %v produced outside the rows covered", rec.Seq)
		}
		for j, p := range rec.Recipients {
			if uint64(p) >= n || (j > 0 && p <= rec.Recipients[j-1]) {
				return fmt.Errorf("record %v has recipients out of order or range", rec.Seq)
			}
		}
	}
	if len(ck.Records) > 0 && ck.Records[len(ck.Records)-1].Record.Seq != ck.LastSeq {
		return fmt.Errorf("last record %v is not the last seq %v", ck.Records[len(ck.Records)-1].Record.Seq, ck.LastSeq)
	}
	if w := ck.Window; w != nil {
		switch {
		case len(ck.Records) > 0:
			return errWindowAndRecords
		case w.First == 0 || w.First > ck.LastSeq+1:
			return fmt.Errorf("window from record %v, the last seq is %v", w.First, ck.LastSeq)
		case w.First == ck.LastSeq+1 && (w.Oplog != ck.Index || w.Outbox != ck.Produced):
			return fmt.Errorf("window of no record at rows %d and %d, not %d and %d", w.Oplog, w.Outbox, ck.Index, ck.Produced)
		case w.First <= ck.LastSeq && (w.Oplog == 0 || w.Oplog >= ck.Index || w.Outbox >= ck.Produced):
			return fmt.Errorf("window from record %v produced outside the rows covered", w.First)
		}
	}
	first, _, retains := ck.FirstRetained()
	for k, r := range ck.Released {
		switch {
		case uint64(r.Member) >= n || (k > 0 && r.Member <= ck.Released[k-1].Member):
			return fmt.Errorf("release %d names member %v out of order or range", k, r.Member)
		case r.Through <= ck.Members[r.Member].Cursor || r.Through > ck.LastSeq:
			return fmt.Errorf("release %d of member %v through %v outside its cursor and the last seq", k, r.Member, r.Through)
		case retains && r.Through >= first:
			return fmt.Errorf("release %d of member %v through %v, a retained record", k, r.Member, r.Through)
		}
	}
	for k, inv := range ck.Invites {
		if inv.Uses == 0 || inv.Uses > uint32(min(n, 1<<32-1)) || (k > 0 && inv.ID <= ck.Invites[k-1].ID) {
			return fmt.Errorf("invitation use %d out of order or range", k)
		}
	}
	for k, m := range ck.Marks {
		if m.Oplog > ck.Index || m.Outbox > ck.Produced {
			return fmt.Errorf("mark %d past the rows covered", k)
		}
		if k > 0 && (m.At < ck.Marks[k-1].At || m.Oplog < ck.Marks[k-1].Oplog || m.Outbox < ck.Marks[k-1].Outbox) {
			return fmt.Errorf("mark %d goes back", k)
		}
	}
	return nil
}

// FirstRetained returns the seq of ck's first unreclaimed record and the
// oplog row that produced it; ok is false when ck retains none.
func (ck *Checkpoint) FirstRetained() (seq oplog.Seq, oplogRow uint64, ok bool) {
	if w := ck.Window; w != nil {
		return w.First, w.Oplog, w.First <= ck.LastSeq
	}
	if len(ck.Records) == 0 {
		return 0, 0, false
	}
	return ck.Records[0].Record.Seq, ck.Records[0].Oplog, true
}

// State returns the outbox.State ck describes, without the payloads of its
// records: each `record`'s payload is in oplog row Records[i].Oplog, which
// the caller reads. Its records share their Recipients with ck. The state
// of a Version4 checkpoint has no records: the caller reads them from the
// outbox rows its Window names.
func (ck *Checkpoint) State() *outbox.State {
	st := &outbox.State{Applied: ck.Index, Produced: ck.Produced, Nonce: ck.Nonce, LastSeq: ck.LastSeq}
	st.Members = make([]outbox.Member, len(ck.Members))
	for i, m := range ck.Members {
		st.Members[i] = outbox.Member{Generation: m.Generation, Retired: m.Retired, Cursor: m.Cursor,
			Bound: m.Bound, Conn: m.Conn, BindingSource: m.BindingSource}
	}
	for _, r := range ck.Released {
		st.Members[r.Member].Released = r.Through
	}
	if len(ck.Invites) > 0 {
		st.InviteUses = make(map[uint64]uint32, len(ck.Invites))
		for _, inv := range ck.Invites {
			st.InviteUses[inv.ID] = inv.Uses
		}
	}
	for _, r := range ck.Records {
		st.Retain(r.Record, r.Oplog)
	}
	return st
}
