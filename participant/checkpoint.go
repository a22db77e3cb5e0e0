package participant

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// A checkpoint is a conversation's state after its first Index oplog rows,
// stored as the byte value checkpoint/<conversation> (store.Compactor),
// which each newer checkpoint replaces (docs/DESIGN.md, Data lifecycle):
//
//	byte 0        checkpointVersion, checkpointVersionReleased or
//	              checkpointVersionInvites
//	bytes 1..n-4  msgpack array of checkpoint, deterministic; under
//	              checkpointVersionReleased an array [checkpoint, released],
//	              under checkpointVersionInvites [checkpoint, released,
//	              invites]
//	last 4 bytes  CRC-32C (Castagnoli) of the msgpack body, big-endian
//
// A checkpoint with no member waiting for a compacted notice is written
// in version 1, byte for byte as before releases existed; one whose
// conversation no invitation with a use count admitted an enroll to, in
// version 1 or 2, byte for byte as before use counts existed.
//
// It is derived by replaying the stored rows through outbox.Project and
// outbox.Apply, matching the stored outbox byte for byte, exactly as a
// start does (deriveCheckpoint), and verified when loaded: it must decode,
// be well formed, and lie inside the streams (the digests of the last row
// of each stream it covers). A checkpoint that fails is a refusal, never a
// fallback to another starting point.

const (
	checkpointVersion         byte = 1
	checkpointVersionReleased byte = 2
	checkpointVersionInvites  byte = 3
)

// CheckpointPrefix starts the key of every checkpoint.
const CheckpointPrefix = "checkpoint/"

func checkpointKey(c ConversationID) string { return CheckpointPrefix + c.String() }

// Classes of unloadable conversations found in their checkpoint.
const (
	// ClassCheckpointCorrupt: the checkpoint does not decode or is not
	// well formed.
	ClassCheckpointCorrupt = "checkpoint_corrupt"
	// ClassCheckpointMismatch: the checkpoint does not belong to the
	// streams it lies beside (a digest differs, a row it names is absent).
	ClassCheckpointMismatch = "checkpoint_mismatch"
	// ClassCheckpointMissing: the oplog was compacted but no checkpoint
	// says where the conversation stood.
	ClassCheckpointMissing = "checkpoint_missing"
)

type checkpoint struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	// Conversation is the conversation the checkpoint belongs to.
	Conversation ConversationID
	// Index is the number of oplog rows covered (state.Applied); Produced
	// the outbox rows they produced.
	Index    uint64
	Produced uint64
	Nonce    [16]byte
	LastSeq  Seq
	Members  []ckMember
	// Records are the unreclaimed records, in seq order.
	Records []ckRecord
	// OplogDigest is the SHA-256 of stored oplog row Index-1; OutboxDigest
	// of outbox row Produced-1 (zero when Produced is 0).
	OplogDigest  [32]byte
	OutboxDigest [32]byte
	// Marks are compaction marks, oldest first (see mark).
	Marks []mark
	// Released lists, by member, the members a Release gave up records
	// of above their cursor (outbox.Member.Released), while their cursor
	// is below it; encoded only under checkpointVersionReleased.
	Released []ckReleased `msgpack:"-"`
	// Invites are the uses of invitations with a use count
	// (outbox.State.InviteUses), by id ascending; encoded only under
	// checkpointVersionInvites.
	Invites []ckInvite `msgpack:"-"`
}

// ckInvite is one invitation's uses.
type ckInvite struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	ID   uint64
	Uses uint32
}

// ckWithInvites is the body of a checkpoint of version
// checkpointVersionInvites.
type ckWithInvites struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Checkpoint *checkpoint
	Released   []ckReleased
	Invites    []ckInvite
}

// ckReleased is one member's outbox.Member.Released.
type ckReleased struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Member  ParticipantID
	Through Seq
}

// ckWithReleased is the body of a checkpoint of version
// checkpointVersionReleased.
type ckWithReleased struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Checkpoint *checkpoint
	Released   []ckReleased
}

// encodeBody returns ck's version and msgpack body.
func (ck *checkpoint) encodeBody() (byte, []byte, error) {
	if len(ck.Invites) > 0 {
		body, err := msgpack.Marshal(&ckWithInvites{Checkpoint: ck, Released: ck.Released, Invites: ck.Invites})
		return checkpointVersionInvites, body, err
	}
	if len(ck.Released) == 0 {
		body, err := msgpack.Marshal(ck)
		return checkpointVersion, body, err
	}
	body, err := msgpack.Marshal(&ckWithReleased{Checkpoint: ck, Released: ck.Released})
	return checkpointVersionReleased, body, err
}

type ckMember struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Generation    Generation
	Retired       bool
	Cursor        Seq
	Bound         bool
	Conn          ConnID
	BindingSource uint64
}

// ckRecord is an unreclaimed record with the positions of the rows that
// produced it: its payload, for a `record`, is in oplog row Oplog.
type ckRecord struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	Record outbox.Record
	Oplog  uint64
	Outbox uint64
}

// mark says that from time At (unix ms) on, every record produced by
// oplog rows below Oplog (outbox rows below Outbox) was reclaimed: every
// recipient acknowledged it or left. Compaction removes rows below the
// newest mark older than its retention.
type mark struct {
	//lint:ignore U1000 msgpack reads the field's tag by reflection: encode as an array
	_msgpack struct{} `msgpack:",as_array"`

	At     int64
	Oplog  uint64
	Outbox uint64
}

var (
	errCheckpointCorrupt = errors.New("checkpoint corrupt")
	crcTable             = crc32.MakeTable(crc32.Castagnoli)
)

func encodeCheckpoint(ck *checkpoint) ([]byte, error) {
	version, body, err := ck.encodeBody()
	if err != nil {
		return nil, fmt.Errorf("participant: encode checkpoint: %w", err)
	}
	out := make([]byte, 0, 1+len(body)+4)
	out = append(out, version)
	out = append(out, body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(body, crcTable)), nil
}

// decodeCheckpoint parses and checks a stored checkpoint: version, CRC,
// a body that re-encodes to exactly itself, and well-formedness. Errors
// wrap errCheckpointCorrupt.
func decodeCheckpoint(b []byte) (*checkpoint, error) {
	if len(b) < 1+4 {
		return nil, fmt.Errorf("%w: %d bytes", errCheckpointCorrupt, len(b))
	}
	if b[0] != checkpointVersion && b[0] != checkpointVersionReleased && b[0] != checkpointVersionInvites {
		return nil, fmt.Errorf("%w: unknown version %d", errCheckpointCorrupt, b[0])
	}
	body := b[1 : len(b)-4]
	if got, want := crc32.Checksum(body, crcTable), binary.BigEndian.Uint32(b[len(b)-4:]); got != want {
		return nil, fmt.Errorf("%w: crc %08x, stored %08x", errCheckpointCorrupt, got, want)
	}
	ck := &checkpoint{}
	var err error
	switch b[0] {
	case checkpointVersion:
		err = msgpack.Unmarshal(body, ck)
	case checkpointVersionReleased:
		w := ckWithReleased{Checkpoint: ck}
		err = msgpack.Unmarshal(body, &w)
		ck.Released = w.Released
	default:
		w := ckWithInvites{Checkpoint: ck}
		err = msgpack.Unmarshal(body, &w)
		ck.Released, ck.Invites = w.Released, w.Invites
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCheckpointCorrupt, err)
	}
	// Encoded again, a version 2 body without releases is version 1's, and
	// one without a checkpoint holds the zero checkpoint: neither is
	// canonical.
	if version, again, err := ck.encodeBody(); err != nil || version != b[0] || !bytes.Equal(again, body) {
		return nil, fmt.Errorf("%w: body is not in canonical form", errCheckpointCorrupt)
	}
	if err := ck.wellFormed(); err != nil {
		return nil, fmt.Errorf("%w: %v", errCheckpointCorrupt, err)
	}
	return ck, nil
}

// wellFormed checks what a checkpoint must satisfy on its own, so that
// nothing later indexes out of range or trusts an impossible state.
func (ck *checkpoint) wellFormed() error {
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
	for k, r := range ck.Released {
		switch {
		case uint64(r.Member) >= n || (k > 0 && r.Member <= ck.Released[k-1].Member):
			return fmt.Errorf("release %d names member %v out of order or range", k, r.Member)
		case r.Through <= ck.Members[r.Member].Cursor || r.Through > ck.LastSeq:
			return fmt.Errorf("release %d of member %v through %v outside its cursor and the last seq", k, r.Member, r.Through)
		case len(ck.Records) > 0 && r.Through >= ck.Records[0].Record.Seq:
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

// state returns the outbox.State the checkpoint describes, without the
// payloads of its records (see loadPayloads).
func (ck *checkpoint) state() *outbox.State {
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
	st.Records = make([]outbox.Retained, len(ck.Records))
	for i, r := range ck.Records {
		st.Records[i] = outbox.Retained{Record: r.Record, Source: r.Oplog}
	}
	return st
}

// loadCheckpoint reads and decodes conversation c's checkpoint: nil when
// st keeps none (or cannot, not being a store.Compactor). A checkpoint
// that does not decode is a *refusal.
func loadCheckpoint(st store.DurableStore, c ConversationID) (*checkpoint, error) {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return nil, nil
	}
	b, err := cs.GetBytes(checkpointKey(c))
	if err != nil {
		return nil, fmt.Errorf("participant: read the checkpoint of %v: %w", c, err)
	}
	if b == nil {
		return nil, nil
	}
	ck, err := decodeCheckpoint(b)
	if err != nil {
		return nil, &refusal{ClassCheckpointCorrupt, err.Error()}
	}
	return ck, nil
}

// streamFirst returns the first stored seq of stream, 0 when st does not
// compact.
func streamFirst(st store.DurableStore, stream string) (uint64, error) {
	cs, ok := store.AsCompactor(st)
	if !ok {
		return 0, nil
	}
	first, err := cs.First(stream)
	if err != nil {
		return 0, fmt.Errorf("participant: first of %s: %w", stream, err)
	}
	return first, nil
}

// readOne returns the payload of entry seq of stream, nil when it is not
// stored (past the end, or compacted).
func readOne(st store.DurableStore, stream string, seq uint64) ([]byte, error) {
	entries, err := store.ReadPage(st, stream, seq, 1, 0)
	if errors.Is(err, store.ErrCompacted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("participant: read %s: %w", stream, err)
	}
	if len(entries) != 1 || entries[0].Seq != seq {
		return nil, nil
	}
	return entries[0].Payload, nil
}

// verifyAgainst checks that ck lies inside c's stored streams: the rows it
// covers exist, and the last of each is the row it was derived from.
func (ck *checkpoint) verifyAgainst(st store.DurableStore, c ConversationID, oplogLen, outboxLen uint64) error {
	mismatch := func(format string, args ...any) error {
		return &refusal{ClassCheckpointMismatch, fmt.Sprintf(format, args...)}
	}
	if ck.Conversation != c {
		return mismatch("checkpoint of conversation %v stored for %v", ck.Conversation, c)
	}
	if ck.Index > oplogLen || ck.Produced > outboxLen {
		return mismatch("checkpoint covers %d oplog and %d outbox rows, the streams have %d and %d",
			ck.Index, ck.Produced, oplogLen, outboxLen)
	}
	last, err := readOne(st, oplog.Stream(c), ck.Index-1)
	if err != nil {
		return err
	}
	if last == nil || sha256.Sum256(last) != ck.OplogDigest {
		return mismatch("oplog row %d is not the row the checkpoint was derived from", ck.Index-1)
	}
	if ck.Produced == 0 {
		return nil
	}
	last, err = readOne(st, outbox.Stream(c), ck.Produced-1)
	if err != nil {
		return err
	}
	if last == nil || sha256.Sum256(last) != ck.OutboxDigest {
		return mismatch("outbox row %d is not the row the checkpoint was derived from", ck.Produced-1)
	}
	return nil
}

// loadPayloads fills in the payloads of the `record`s of state from the
// oplog rows the checkpoint names, checking that each row is the tell that
// produced its record.
func (ck *checkpoint) loadPayloads(st store.DurableStore, c ConversationID, state *outbox.State) error {
	for i, r := range ck.Records {
		if r.Record.Kind != outbox.KindRecord {
			continue
		}
		b, err := readOne(st, oplog.Stream(c), r.Oplog)
		if err != nil {
			return err
		}
		if b == nil {
			return &refusal{ClassCheckpointMismatch, fmt.Sprintf("oplog row %d, the payload of record %v, is not stored", r.Oplog, r.Record.Seq)}
		}
		row, err := oplog.Decode(b)
		if err != nil {
			return &refusal{ClassOplogCorrupt, fmt.Sprintf("oplog row %d: %v", r.Oplog, err)}
		}
		if row.Kind != oplog.KindTell || row.Seq != r.Record.Seq || row.Participant != r.Record.Participant {
			return &refusal{ClassCheckpointMismatch, fmt.Sprintf("oplog row %d is not the tell of record %v", r.Oplog, r.Record.Seq)}
		}
		state.Records[i].Payload = row.Payload
		state.PayloadBytes += int64(len(row.Payload))
	}
	return nil
}

// rederive checks conversation c's stored checkpoint against a replay from
// row 0, while row 0 is still stored: the thorough check that the offline
// verify runs. A start trusts a checkpoint that decodes (CRC, canonical
// form), is well formed and matches the digests of the last rows it
// covers; only a replay can tell a state that was derived wrongly.
// Compaction marks are left out of the comparison: they depend on the
// clock of the pass that wrote them. A difference is a *refusal.
func rederive(ctx context.Context, st store.DurableStore, c ConversationID, p pages) error {
	ck, err := loadCheckpoint(st, c)
	if err != nil || ck == nil {
		return err
	}
	if first, err := streamFirst(st, oplog.Stream(c)); err != nil || first > 0 {
		return err
	}
	want, err := deriveCheckpoint(ctx, st, c, p, nil, ck.Index, time.Now(), DefaultRetain)
	if err != nil {
		return err
	}
	got := *ck
	got.Marks, want.Marks = nil, nil
	a, err := encodeCheckpoint(&got)
	if err != nil {
		return err
	}
	b, err := encodeCheckpoint(want)
	if err != nil {
		return err
	}
	if !bytes.Equal(a, b) {
		return &refusal{ClassCheckpointMismatch, fmt.Sprintf("the checkpoint at oplog row %d is not what its rows derive", ck.Index)}
	}
	return nil
}
