package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/participantd/participantd/oplog"
)

// ErrInconsistent reports an oplog row that cannot follow the state it is
// applied to: an id, generation or binding that does not match. On the live
// path that is a broken invariant; during reconciliation it means the stored
// oplog is not one this code wrote.
var ErrInconsistent = errors.New("outbox: oplog row inconsistent with state")

// Member is one participant of a conversation, as the oplog made it.
type Member struct {
	// Generation is the current capability generation.
	Generation oplog.Generation
	// Retired is set once the participant left.
	Retired bool
	// Cursor is the highest seq the participant acknowledged, durably.
	Cursor oplog.Seq
	// Bound reports a live binding; Conn is its connection and
	// BindingSource the oplog index of the enroll or attach that created it.
	// A binding's generation is always Generation.
	Bound         bool
	Conn          oplog.ConnID
	BindingSource uint64
	// Released is the last record addressed to this member above its
	// cursor that a Release gave up: while Cursor is below it, the
	// member's binding is told, before its next delivery, that every
	// record through Released is gone (PROTOCOL.md, Compacted history).
	// 0: none.
	Released oplog.Seq
}

// Retain appends rec, produced by oplog row source, to s.Records without
// its payload (a start or a derivation loading a checkpoint's records,
// whose payloads are read from row source). A record of the same subject
// and recipients as the last one shares its list, and its run: loaded
// records are not interned (their memberships differ), so this is what
// keeps a run of one sender's records to one list.
func (s *State) Retain(rec Record, source uint64) {
	r := &s.Records
	var l *recipientList
	if n := len(r.runs); n > 0 && r.runs[n-1].participant == rec.Participant && slices.Equal(r.runs[n-1].recipients.get(), rec.Recipients) {
		l = r.runs[n-1].recipients
	} else if rec.Recipients != nil {
		list := recipientList(rec.Recipients)
		l = &list
	}
	r.push(rec.Seq, rec.Participant, l, rec.Kind, rec.Cause, source, nil)
}

// State is a conversation as its oplog rows 0..Applied-1 made it. It is a
// plain value: Project reads it, Apply changes it, neither does I/O.
type State struct {
	// Applied is the number of oplog rows applied; the next row's index.
	Applied uint64
	// Produced is the number of outbox rows those oplog rows produced; the
	// next outbox row's seq in the store.
	Produced uint64
	// Nonce is the conversation's salt from its Genesis row.
	Nonce [16]byte
	// LastSeq is the seq of the last record, 0 before the first.
	LastSeq oplog.Seq
	// Members is indexed by participant id.
	Members []Member
	// Records holds the records not yet reclaimed, contiguous in seq up
	// to LastSeq.
	Records Retention
	// PayloadBytes is the total length of the payloads Records holds in
	// memory (not evicted).
	PayloadBytes int64
	// EvictedBytes is the total length of the payloads of Records that
	// Evict dropped from memory.
	EvictedBytes int64
	// InviteUses counts, by invitation id, the enrolls that invitations
	// with a use count admitted: an enroll row whose Payload is 8 bytes
	// names one (package participant, invite.go). Nil until the first.
	// Apply replaces the map rather than writing it, so a clone sharing
	// it stays right.
	InviteUses map[uint64]uint32
	// Deleted is set by a Delete row: every participant had left, and the
	// conversation takes no row after it. A checkpoint never covers it
	// (participant: a deleted conversation is known by its last row).
	Deleted bool

	// evicted is the seq through which Evict has passed.
	evicted oplog.Seq
	// recipients interns the recipient lists of retained records, by
	// subject, for the current membership: records of one subject share
	// one list instead of holding a copy each (a copy costs 8 bytes per
	// member per record). Apply replaces the map, never clears it, when
	// the membership changes, so that a clone sharing it stays right.
	recipients map[oplog.ParticipantID]*recipientList
}

// maxInterned bounds the recipient lists interned at once.
const maxInterned = 64

// intern returns a list equal to recips, shared with the earlier records
// of subject under the same membership when there are any.
func (s *State) intern(subject oplog.ParticipantID, recips []oplog.ParticipantID) *recipientList {
	if l, ok := s.recipients[subject]; ok && len(*l) == len(recips) {
		return l
	}
	if s.recipients == nil || len(s.recipients) >= maxInterned {
		s.recipients = make(map[oplog.ParticipantID]*recipientList)
	}
	rl := recipientList(recips)
	l := &rl
	s.recipients[subject] = l
	return l
}

// Clone returns a copy of s that Project and Apply can advance while s is
// still being read. Members are copied; Records share their arrays, which
// is safe because Apply only appends past the original's length and never
// writes a record in place (only Evict does).
func (s *State) Clone() *State {
	c := *s
	c.Members = append([]Member(nil), s.Members...)
	return &c
}

// Member returns participant p, or nil when p was never enrolled.
func (s *State) Member(p oplog.ParticipantID) *Member {
	if uint64(p) >= uint64(len(s.Members)) {
		return nil
	}
	return &s.Members[p]
}

// Record returns the retained record with seq q, and false when q was
// reclaimed or does not exist.
func (s *State) Record(q oplog.Seq) (Retained, bool) {
	return s.Records.Seq(q)
}

// AllLeft reports whether the conversation had participants and every one
// of them has left: what a Delete row requires.
func (s *State) AllLeft() bool {
	for i := range s.Members {
		if !s.Members[i].Retired {
			return false
		}
	}
	return len(s.Members) > 0
}

// recipientsOf lists the members that are not retired, except subject.
func (s *State) recipientsOf(subject oplog.ParticipantID) []oplog.ParticipantID {
	var out []oplog.ParticipantID
	for i := range s.Members {
		if p := oplog.ParticipantID(i); p != subject && !s.Members[i].Retired {
			out = append(out, p)
		}
	}
	return out
}

// Project returns the outbox rows that oplog row r, at index idx, produces
// from state s: nil or exactly one row. It is pure: the same state and row
// always give the same rows, which is what lets reconciliation re-derive a
// missing outbox suffix byte for byte. Errors wrap ErrInconsistent.
func Project(s *State, idx uint64, r *oplog.Row) ([]Row, error) {
	if idx != s.Applied {
		return nil, fmt.Errorf("%w: row index %d, expected %d", ErrInconsistent, idx, s.Applied)
	}
	if r.Kind != oplog.KindGenesis && idx == 0 {
		return nil, fmt.Errorf("%w: row 0 is %v, not genesis", ErrInconsistent, r.Kind)
	}
	if s.Deleted {
		return nil, fmt.Errorf("%w: %v row after the conversation's delete", ErrInconsistent, r.Kind)
	}
	seq := s.LastSeq
	record := func(kind RecordKind, cause oplog.Cause) Record {
		seq++
		return Record{Seq: seq, Kind: kind, Participant: r.Participant, Cause: cause, Recipients: s.recipientsOf(r.Participant)}
	}
	produced := func(records ...Record) ([]Row, error) {
		if last := records[len(records)-1].Seq; r.Seq != last {
			return nil, fmt.Errorf("%w: %v row names seq %v, its last record is %v", ErrInconsistent, r.Kind, r.Seq, last)
		}
		return []Row{{Kind: Produced, Source: idx, Records: records}}, nil
	}
	if r.Kind == oplog.KindRelease {
		// A Release gives up retained records, the oldest first, and
		// produces none.
		if s.Records.Len() == 0 || r.Through < s.Records.First() || r.Through > s.LastSeq || r.Seq != 0 {
			return nil, fmt.Errorf("%w: release through %v of records %v..%v", ErrInconsistent, r.Through, s.Records.First(), s.LastSeq)
		}
		return nil, nil
	}
	if r.Kind == oplog.KindDelete {
		// A Delete ends a conversation every participant left, and
		// produces nothing: nobody is left to tell.
		if !s.AllLeft() || s.Records.Len() > 0 || r.Seq != 0 {
			return nil, fmt.Errorf("%w: delete of a conversation of %d members, all left %v, %d records retained",
				ErrInconsistent, len(s.Members), s.AllLeft(), s.Records.Len())
		}
		return nil, nil
	}
	m := s.Member(r.Participant)
	switch r.Kind {
	case oplog.KindGenesis:
		if idx != 0 || r.Seq != 0 {
			return nil, fmt.Errorf("%w: genesis at row %d", ErrInconsistent, idx)
		}
		return nil, nil
	case oplog.KindEnroll:
		if uint64(r.Participant) != uint64(len(s.Members)) || r.Generation != 1 || r.Conn.IsZero() {
			return nil, fmt.Errorf("%w: enroll of %v %v, next id p%d", ErrInconsistent, r.Participant, r.Generation, len(s.Members))
		}
		return produced(record(KindJoined, oplog.CauseNone))
	}
	if m == nil || m.Retired {
		return nil, fmt.Errorf("%w: %v row for absent or retired %v", ErrInconsistent, r.Kind, r.Participant)
	}
	switch r.Kind {
	case oplog.KindAttach:
		if r.Generation != m.Generation+1 || r.Conn.IsZero() || r.Cursor != m.Cursor {
			return nil, fmt.Errorf("%w: attach of %v to %v at %v", ErrInconsistent, r.Participant, r.Generation, m.Generation)
		}
		if m.Bound {
			return produced(record(KindDetached, oplog.CauseSuperseded), record(KindAttached, oplog.CauseNone))
		}
		return produced(record(KindAttached, oplog.CauseNone))
	case oplog.KindLeave:
		if r.Generation != m.Generation || (r.Cause != oplog.CauseNone && r.Cause != oplog.CauseEvicted) {
			return nil, fmt.Errorf("%w: leave of %v at %v (%v), current %v", ErrInconsistent, r.Participant, r.Generation, r.Cause, m.Generation)
		}
		return produced(record(KindLeft, r.Cause))
	case oplog.KindAck:
		if r.Through <= m.Cursor || r.Through > s.LastSeq || r.Seq != 0 {
			return nil, fmt.Errorf("%w: ack of %v through %v, cursor %v", ErrInconsistent, r.Participant, r.Through, m.Cursor)
		}
		if rec, ok := s.Record(r.Through); !ok || !rec.Addressed(r.Participant) {
			return nil, fmt.Errorf("%w: ack of %v through %v, not addressed to it", ErrInconsistent, r.Participant, r.Through)
		}
		return []Row{{Kind: AckAdvanced, Source: idx, Participant: r.Participant, Through: r.Through}}, nil
	}
	// Tell, Detach and End need the binding they name.
	if !m.Bound || r.Generation != m.Generation {
		return nil, fmt.Errorf("%w: %v of %v at %v without its binding", ErrInconsistent, r.Kind, r.Participant, r.Generation)
	}
	switch r.Kind {
	case oplog.KindTell:
		return produced(record(KindRecord, oplog.CauseNone))
	case oplog.KindDetach:
		return produced(record(KindDetached, oplog.CauseClean))
	case oplog.KindEnd:
		if r.Conn != m.Conn || !r.Cause.Valid() || r.Cause == oplog.CauseSuperseded {
			return nil, fmt.Errorf("%w: end of %v on %v (%v), bound on %v", ErrInconsistent, r.Participant, r.Conn, r.Cause, m.Conn)
		}
		if r.Cause.Died() {
			return produced(record(KindDied, r.Cause))
		}
		return produced(record(KindDetached, r.Cause))
	}
	return nil, fmt.Errorf("%w: unknown kind %v", ErrInconsistent, r.Kind)
}

// Apply advances s by oplog row r at index idx and the rows Project returned
// for it. The caller must have called Project on the same s, idx and r.
// Records keep a reference to r.Payload.
func Apply(s *State, idx uint64, r *oplog.Row, rows []Row) {
	s.Applied = idx + 1
	s.Produced += uint64(len(rows))
	for _, row := range rows {
		for _, rec := range row.Records {
			var l *recipientList
			if rec.Recipients != nil {
				l = s.intern(rec.Participant, rec.Recipients)
			}
			var payload []byte
			if rec.Kind == KindRecord {
				payload = r.Payload
				s.PayloadBytes += int64(len(r.Payload))
			}
			s.Records.push(rec.Seq, rec.Participant, l, rec.Kind, rec.Cause, idx, payload)
			s.LastSeq = rec.Seq
		}
	}
	switch r.Kind {
	case oplog.KindGenesis:
		s.Nonce = r.Nonce
	case oplog.KindEnroll:
		s.Members = append(s.Members, Member{Generation: 1, Bound: true, Conn: r.Conn, BindingSource: idx})
		s.recipients = nil // the membership changed
		if len(r.Payload) == 8 {
			uses := make(map[uint64]uint32, len(s.InviteUses)+1)
			maps.Copy(uses, s.InviteUses)
			uses[binary.BigEndian.Uint64(r.Payload)]++
			s.InviteUses = uses
		}
	case oplog.KindAttach:
		m := &s.Members[r.Participant]
		m.Generation, m.Bound, m.Conn, m.BindingSource = r.Generation, true, r.Conn, idx
	case oplog.KindAck:
		m := &s.Members[r.Participant]
		m.Cursor = r.Through
		if m.Released <= m.Cursor {
			m.Released = 0
		}
	case oplog.KindDetach, oplog.KindEnd:
		m := &s.Members[r.Participant]
		m.Bound, m.Conn = false, oplog.ConnID{}
	case oplog.KindLeave:
		m := &s.Members[r.Participant]
		m.Retired, m.Bound, m.Conn = true, false, oplog.ConnID{}
		s.recipients = nil // the membership changed
	case oplog.KindRelease:
		s.release(r.Through)
	case oplog.KindDelete:
		s.Deleted = true
	}
	// After every row, not only acks and leaves: a record addressed to
	// nobody is settled as soon as it exists.
	s.reclaim()
}

// compactGarbageBytes is how many reclaimed payload bytes the array under
// Records may keep referencing before Records moves to an array of its own.
const compactGarbageBytes = 1 << 20

// reclaim drops the leading records that no recipient still needs: each
// recipient acknowledged it or left.
func (s *State) reclaim() {
	r := &s.Records
	if r.Len() == 0 {
		return
	}
	n := 0
	for k := r.runOf(r.first); k < len(r.runs); k++ {
		// The records of a run up to the lowest cursor of its live
		// recipients are settled.
		through := s.settledThrough(r.runs[k].recipients.get())
		end := r.runEnd(k)
		if through < end-1 {
			if through >= r.first+oplog.Seq(n) {
				n = int(through-r.first) + 1
			}
			break
		}
		n = int(end - r.first)
	}
	s.dropFirst(n)
}

// settledThrough returns the highest seq every live member of recipients
// acknowledged: the highest possible when none is live.
func (s *State) settledThrough(recipients []oplog.ParticipantID) oplog.Seq {
	through := oplog.Seq(math.MaxUint64)
	for _, p := range recipients {
		if m := &s.Members[p]; !m.Retired {
			through = min(through, m.Cursor)
		}
	}
	return through
}

// dropFirst drops the n oldest retained records.
func (s *State) dropFirst(n int) {
	held, evicted := s.Records.dropFirst(n)
	s.PayloadBytes -= held
	s.EvictedBytes -= evicted
}

// release gives up the retained records through seq q, acknowledged or
// not: each member that had one of them to receive above its cursor
// learns, in Released, the last such record, and the records go.
func (s *State) release(q oplog.Seq) {
	r := &s.Records
	if r.Len() == 0 || q < r.first {
		return
	}
	for k := r.runOf(r.first); k < len(r.runs) && r.runs[k].seq <= q; k++ {
		last := min(r.runEnd(k)-1, q)
		for _, p := range r.runs[k].recipients.get() {
			if m := &s.Members[p]; !m.Retired && m.Cursor < last {
				m.Released = last
			}
		}
	}
	s.dropFirst(int(min(q, s.LastSeq) - r.first + 1))
}

// Evict drops payloads from memory, oldest record first, until at least
// need bytes are freed or none is left, and returns the bytes freed. An
// evicted record keeps its place and metadata, and is marked Evicted:
// whoever still needs its payload reads it from oplog row Source. The
// records evicted, and those passed over, are then cold (Retention).
//
// Unlike Apply, Evict writes records in place, and clones share them: the
// caller must be the only one reading or writing s and every state
// sharing its records (package participant: under the conversation's
// turn and write lock, after publishing s).
func (s *State) Evict(need int64) int64 {
	var freed int64
	r := &s.Records
	if r.Len() == 0 {
		return 0
	}
	i := 0
	if s.evicted >= r.first {
		i = int(s.evicted-r.first) + 1
	}
	for i < r.Len() && freed < need {
		k := r.runOf(r.first + oplog.Seq(i))
		end := int(r.runEnd(k) - r.first)
		if r.runs[k].kind != KindRecord {
			s.evicted, i = r.first+oplog.Seq(end-1), end
			continue
		}
		for ; i < end && freed < need; i++ {
			s.evicted = r.first + oplog.Seq(i)
			if i < r.coldLen {
				continue // cold: no payload held
			}
			if sl := &r.slots[i-r.coldLen]; sl.payload != nil && sl.size > 0 {
				freed += int64(sl.size)
				sl.payload = nil
			}
		}
	}
	if s.evicted >= r.first {
		r.cool(int(s.evicted - r.first))
	}
	s.PayloadBytes -= freed
	s.EvictedBytes += freed
	return freed
}

// Next returns the first record after seq `after` addressed to p, and
// false when there is none.
func (s *State) Next(p oplog.ParticipantID, after oplog.Seq) (Retained, bool) {
	r := &s.Records
	if r.Len() == 0 {
		return Retained{}, false
	}
	q := max(after+1, r.first)
	for k := r.runOf(min(q, r.first+oplog.Seq(r.Len()-1))); k < len(r.runs); k++ {
		if end := r.runEnd(k); q < end && slices.Contains(r.runs[k].recipients.get(), p) {
			return r.view(int(q-r.first), &r.runs[k]), true
		} else {
			q = max(q, end)
		}
	}
	return Retained{}, false
}

// recipientList is a record's recipient list, shared by the records of a
// run and, through State.recipients, by the runs of one subject.
type recipientList []oplog.ParticipantID

// get returns the list l points to, nil for none.
func (l *recipientList) get() []oplog.ParticipantID {
	if l == nil {
		return nil
	}
	return *l
}
