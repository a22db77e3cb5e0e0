package outbox

import (
	"fmt"
	"iter"
	"maps"
	"math"
	"slices"
	"sort"
	"unsafe"

	"github.com/participantd/participantd/oplog"
)

// Retention holds a conversation's retained records (State.Records),
// contiguous in seq from First to Last.
//
// A recipient that never reads pins every record after its cursor, up to
// the conversation's backlog limit (package participant), and a checkpoint
// derivation holds them once more while it runs, so what a record costs
// here is what a deaf reader costs. A record holding its payload is a
// 16-byte slot: the payload, as a pointer and a length, and the oplog row
// that produced it, as an offset from a base. Its seq is its place. The
// oldest records without a payload in memory (evicted, or retained
// without one by a load or a derivation) are cold: held as spans of
// records of one payload length produced by consecutive oplog rows, 24
// bytes a span, none a record. What records told in a row share, the
// subject, kind, cause and recipient list, is held once per run of records
// that share it. So a deaf reader's backlog of one sender's tells is one
// run and, past the payloads held in memory, one span, however long.
//
// The arrays are shared with the clones of the state (State.Clone): only
// their ends are appended to, and no element below a clone's length is
// written except by Evict, DropPayload, HoldPayload and ClearBelow, whose
// callers own every state sharing them. Those move records between the
// cold spans and the slots of their own Retention only: the arrays a clone
// sees keep their elements (a slot's payload cleared in place), and the
// spans' array is appended to past every clone's end or replaced.
type Retention struct {
	// first is the seq of the oldest record; meaningless while none is
	// retained. Records first to first+coldLen-1 are cold, the rest are
	// slots.
	first oplog.Seq
	// cold are ascending by seq: span k holds the records from cold[k].seq
	// (or first, when it is later) to the record before cold[k+1].seq, the
	// last one to first+coldLen-1.
	cold    []coldSpan
	coldLen int
	slots   []slot
	// runs are ascending by seq; run k holds the records from runs[k].seq
	// (or first, when it is later) to the record before runs[k+1].seq,
	// the last one to Last. The first run may begin before first.
	runs []run
	// base is what slots' source offsets are added to.
	base uint64
	// far holds, by seq, the sources too far past base for an offset
	// (source farSource). Written by replacement, never in place, so that
	// a clone sharing it stays right. Nil but in a conversation whose
	// retained records span four billion oplog rows.
	far map[oplog.Seq]uint64
	// garbage counts the slots, runs and spans dropped since the arrays
	// were last copied: the arrays the slices slide along still hold them.
	garbage, garbageRuns, garbageCold int
	garbageBytes                      int64
}

// coldSpan is a run of cold records: record q of it has no payload in
// memory, one of size bytes (0: none, or none known) evicted, and was
// produced by oplog row source+(q-seq).
type coldSpan struct {
	seq    oplog.Seq
	source uint64
	size   uint32
}

// slot is one retained record's own part.
type slot struct {
	// payload points at the payload of a `record`, size is its length:
	// nil and 0 for a record without one; nil and the length it had once
	// evicted. A payload comes from a msgpack bin (an oplog row or a
	// request), so it is shorter than 4 GiB.
	payload *byte
	size    uint32
	// source is the record's oplog row, less Retention.base; farSource
	// when Retention.far holds it.
	source uint32
}

// farSource marks a slot whose source Retention.far holds.
const farSource = math.MaxUint32

// run is what consecutive records share.
type run struct {
	seq         oplog.Seq
	participant oplog.ParticipantID
	recipients  *recipientList
	kind        RecordKind
	cause       oplog.Cause
}

// Retained is one retained record, as Retention returns it: a copy, which
// the caller may keep. Its payload and recipient list are shared.
type Retained struct {
	// Seq, Participant, Kind and Cause are the record's (Record).
	Seq         oplog.Seq
	Participant oplog.ParticipantID
	// Source is the index of the oplog row that produced the record, where
	// an evicted payload is read back from.
	Source     uint64
	recipients *recipientList
	payload    *byte
	size       uint32
	Kind       RecordKind
	Cause      oplog.Cause
	// Evicted is set once Evict dropped the payload from memory: whoever
	// still needs it reads it from oplog row Source.
	Evicted bool
}

// Payload returns the payload of a `record` held in memory: nil for a
// record without one and once Evicted. It aliases the oplog row's payload:
// the caller must not write it.
func (r *Retained) Payload() []byte {
	if r.payload == nil {
		return nil
	}
	return unsafe.Slice(r.payload, r.size)
}

// PayloadLen is the length of the record's payload, held or evicted.
func (r *Retained) PayloadLen() int { return int(r.size) }

// Recipients returns the record's recipients (Record.Recipients). The
// list is shared: the caller must not write it.
func (r *Retained) Recipients() []oplog.ParticipantID {
	return r.recipients.get()
}

// Record returns the record r retains, as its outbox row carries it. Its
// Recipients are shared with r.
func (r *Retained) Record() Record {
	return Record{Seq: r.Seq, Kind: r.Kind, Participant: r.Participant, Cause: r.Cause, Recipients: r.Recipients()}
}

// Addressed reports whether p is one of r's recipients.
func (r *Retained) Addressed(p oplog.ParticipantID) bool {
	return slices.Contains(r.Recipients(), p)
}

// Len is the number of records retained.
func (r *Retention) Len() int { return r.coldLen + len(r.slots) }

// First is the seq of the oldest record retained, 0 when none is.
func (r *Retention) First() oplog.Seq {
	if r.Len() == 0 {
		return 0
	}
	return r.first
}

// At returns the i-th oldest record retained, 0 <= i < Len.
func (r *Retention) At(i int) Retained {
	q := r.first + oplog.Seq(i)
	return r.view(i, &r.runs[r.runOf(q)])
}

// Seq returns the record with seq q, and whether it is retained.
func (r *Retention) Seq(q oplog.Seq) (Retained, bool) {
	if r.Len() == 0 || q < r.first || q-r.first >= oplog.Seq(r.Len()) {
		return Retained{}, false
	}
	return r.At(int(q - r.first)), true
}

// All yields the records retained with their places, oldest first.
func (r *Retention) All() iter.Seq2[int, Retained] {
	return func(yield func(int, Retained) bool) {
		if r.Len() == 0 {
			return
		}
		k := r.runOf(r.first)
		for i := range r.Len() {
			q := r.first + oplog.Seq(i)
			for k+1 < len(r.runs) && r.runs[k+1].seq <= q {
				k++
			}
			if !yield(i, r.view(i, &r.runs[k])) {
				return
			}
		}
	}
}

// runOf returns the index of the run holding the record with seq q.
func (r *Retention) runOf(q oplog.Seq) int {
	if n := len(r.runs); r.runs[n-1].seq <= q {
		return n - 1
	}
	return sort.Search(len(r.runs), func(k int) bool { return r.runs[k].seq > q }) - 1
}

// runEnd returns the seq after the last record of run k.
func (r *Retention) runEnd(k int) oplog.Seq {
	if k+1 < len(r.runs) {
		return r.runs[k+1].seq
	}
	return r.first + oplog.Seq(r.Len())
}

// coldOf returns the index of the span holding the cold record with seq q.
func (r *Retention) coldOf(q oplog.Seq) int {
	if n := len(r.cold); r.cold[n-1].seq <= q {
		return n - 1
	}
	return sort.Search(len(r.cold), func(k int) bool { return r.cold[k].seq > q }) - 1
}

// rec returns the i-th oldest record's payload, length and source.
func (r *Retention) rec(i int) (*byte, uint32, uint64) {
	q := r.first + oplog.Seq(i)
	if i < r.coldLen {
		sp := &r.cold[r.coldOf(q)]
		return nil, sp.size, sp.source + uint64(q-sp.seq)
	}
	s := &r.slots[i-r.coldLen]
	return s.payload, s.size, r.source(q, s)
}

func (r *Retention) view(i int, ru *run) Retained {
	payload, size, source := r.rec(i)
	return Retained{Seq: r.first + oplog.Seq(i), Participant: ru.participant, Source: source, recipients: ru.recipients,
		payload: payload, size: size, Kind: ru.kind, Cause: ru.cause, Evicted: payload == nil && size > 0}
}

func (r *Retention) source(q oplog.Seq, s *slot) uint64 {
	if s.source == farSource {
		return r.far[q]
	}
	return r.base + uint64(s.source)
}

// push appends the record with seq q, which must follow the last one.
func (r *Retention) push(q oplog.Seq, participant oplog.ParticipantID, recipients *recipientList, kind RecordKind, cause oplog.Cause, source uint64, payload []byte) {
	if uint64(len(payload)) > math.MaxUint32 {
		panic(fmt.Sprintf("outbox: a payload of %d bytes (a msgpack bin holds less than 4 GiB)", len(payload)))
	}
	if r.Len() == 0 {
		r.first = q
	} else if want := r.first + oplog.Seq(r.Len()); q != want {
		panic(fmt.Sprintf("outbox: record %v retained after %v", q, want-1))
	}
	if n := len(r.runs); n == 0 || !r.runs[n-1].holds(participant, recipients, kind, cause) {
		if r.Len() == 0 {
			// Nothing is left of the runs before: slide past them.
			r.runs, r.garbageRuns = r.runs[n:], r.garbageRuns+n
		}
		r.runs = append(r.runs, run{seq: q, participant: participant, recipients: recipients, kind: kind, cause: cause})
	}
	if len(r.slots) == 0 {
		if payload == nil {
			// Every record before it is cold: so is one without a payload.
			r.pushCold(q, source, 0)
			return
		}
		r.base, r.far = source, nil
	}
	s := slot{payload: unsafe.SliceData(payload), size: uint32(len(payload))}
	if off := source - r.base; source >= r.base && off < farSource {
		s.source = uint32(off)
	} else {
		s.source = farSource
		far := make(map[oplog.Seq]uint64, len(r.far)+1)
		maps.Copy(far, r.far)
		far[q] = source
		r.far = far
	}
	r.slots = append(r.slots, s)
}

func (ru *run) holds(participant oplog.ParticipantID, recipients *recipientList, kind RecordKind, cause oplog.Cause) bool {
	return ru.participant == participant && ru.recipients == recipients && ru.kind == kind && ru.cause == cause
}

// pushCold appends the cold record q, produced by oplog row source, with
// size bytes evicted: to the last span when it goes on with it, else as a
// span of its own. The spans' array is only appended to, past every
// clone's end (thaw replaces it).
func (r *Retention) pushCold(q oplog.Seq, source uint64, size uint32) {
	if n := len(r.cold); n > 0 && r.coldLen > 0 {
		if sp := &r.cold[n-1]; sp.size == size && sp.source+uint64(q-sp.seq) == source {
			r.coldLen++
			return
		}
	}
	r.cold = append(r.cold, coldSpan{seq: q, source: source, size: size})
	r.coldLen++
}

// cool moves the oldest slots that hold no payload to the cold spans, up
// to the i-th oldest record at most.
func (r *Retention) cool(i int) {
	moved := 0
	for len(r.slots) > moved && r.coldLen <= i && r.slots[moved].payload == nil {
		q := r.first + oplog.Seq(r.coldLen)
		s := &r.slots[moved]
		r.pushCold(q, r.source(q, s), s.size)
		moved++
	}
	if moved == 0 {
		return
	}
	r.slots = r.slots[moved:]
	r.garbage += moved
	if len(r.slots) == 0 {
		r.far = nil
	}
	r.compactIfDue()
}

// thaw moves the cold records from the i-th oldest on back to slots of
// their own (a start holding their payloads again). The spans before stay
// shared; the array of those after is no longer appended to.
func (r *Retention) thaw(i int) {
	n := r.coldLen - i
	slots := make([]slot, 0, n+len(r.slots)+len(r.slots)/4+8)
	for j := i; j < r.coldLen; j++ {
		_, size, _ := r.rec(j)
		slots = append(slots, slot{size: size})
	}
	slots = append(slots, r.slots...)
	old := *r
	r.slots = slots
	if i == 0 {
		r.cold = nil
	} else {
		r.cold = slices.Clip(r.cold[:r.coldOf(r.first+oplog.Seq(i-1))+1])
	}
	r.coldLen = i
	r.garbage, r.garbageBytes = 0, 0
	// Every slot's source is set anew, offset from the first slot's.
	r.rebase(func(j int) uint64 { _, _, src := old.rec(i + j); return src })
}

// rebase sets every slot's source, src(j) for the j-th slot, offset from
// the first slot's.
func (r *Retention) rebase(src func(j int) uint64) {
	var far map[oplog.Seq]uint64
	if len(r.slots) > 0 {
		base := src(0)
		for j := range r.slots {
			s := src(j)
			if off := s - base; off < farSource {
				r.slots[j].source = uint32(off)
			} else {
				if far == nil {
					far = make(map[oplog.Seq]uint64)
				}
				q := r.first + oplog.Seq(r.coldLen+j)
				r.slots[j].source, far[q] = farSource, s
			}
		}
		r.base = base
	}
	r.far = far
}

// dropFirst drops the n oldest records and returns the payload bytes
// they held in memory and the bytes evicted from them.
func (r *Retention) dropFirst(n int) (held, evicted int64) {
	if n == 0 {
		return 0, 0
	}
	c := min(n, r.coldLen)
	for q, end := r.first, r.first+oplog.Seq(c); q < end; {
		sp := &r.cold[r.coldOf(q)]
		next := end
		if k := r.coldOf(q); k+1 < len(r.cold) {
			next = min(end, r.cold[k+1].seq)
		}
		evicted += int64(next-q) * int64(sp.size)
		q = next
	}
	for i := range n - c {
		switch s := &r.slots[i]; {
		case s.payload != nil:
			held += int64(s.size)
		case s.size > 0:
			evicted += int64(s.size)
		}
	}
	// The dropped prefix is not cleared: a clone may share it with the
	// published state. The arrays stay referenced while the slices move
	// along them, so once what they hold for nothing outweighs what is
	// live, the live part moves to arrays of its own (amortized: a copy
	// of k records follows at least k, or compactGarbageBytes, dropped).
	r.slots = r.slots[n-c:]
	r.first += oplog.Seq(n)
	r.coldLen -= c
	r.garbage += n - c
	r.garbageBytes += held
	k := len(r.cold)
	if r.coldLen > 0 {
		k = r.coldOf(r.first)
	}
	r.cold = r.cold[k:]
	r.garbageCold += k
	k = 0
	if r.Len() > 0 {
		k = r.runOf(r.first)
	} else if len(r.runs) > 0 {
		k = len(r.runs) - 1 // the last run may go on with the next record
	}
	r.runs = r.runs[k:]
	r.garbageRuns += k
	r.compactIfDue()
	return held, evicted
}

// compactIfDue compacts once the arrays hold more dropped elements than
// live ones (or compactGarbageBytes of payloads).
func (r *Retention) compactIfDue() {
	if r.garbage >= max(len(r.slots), 64) || r.garbageBytes >= compactGarbageBytes ||
		r.garbageRuns >= max(len(r.runs), 64) || r.garbageCold >= max(len(r.cold), 64) {
		r.compact()
	}
}

// compact moves the live records to arrays of their own, their sources
// offset from the oldest one's.
func (r *Retention) compact() {
	old := *r
	hot := r.first + oplog.Seq(r.coldLen)
	r.slots = append(make([]slot, 0, len(r.slots)+len(r.slots)/4+8), r.slots...)
	r.rebase(func(j int) uint64 { q := hot + oplog.Seq(j); return old.source(q, &old.slots[j]) })
	r.runs = append(make([]run, 0, len(r.runs)+len(r.runs)/4+4), r.runs...)
	r.cold = append(make([]coldSpan, 0, len(r.cold)+len(r.cold)/4+4), r.cold...)
	r.garbage, r.garbageRuns, r.garbageCold, r.garbageBytes = 0, 0, 0, 0
}

// HoldPayload holds p, read back from oplog row Source, as the payload of
// the i-th record, retained without it (a start loading a checkpoint's
// records). The caller owns every state sharing r.
func (r *Retention) HoldPayload(i int, p []byte) {
	if uint64(len(p)) > math.MaxUint32 {
		panic(fmt.Sprintf("outbox: a payload of %d bytes (a msgpack bin holds less than 4 GiB)", len(p)))
	}
	if i < r.coldLen {
		r.thaw(i)
	}
	s := &r.slots[i-r.coldLen]
	s.payload, s.size = unsafe.SliceData(p), uint32(len(p))
}

// DropPayload forgets the payload the i-th record holds without marking it
// evicted (a replay that reads no payload, package participant) and
// returns its length; an evicted record is left as it is. The record, and
// those before it without a payload, are then cold. The caller owns every
// state sharing r.
func (r *Retention) DropPayload(i int) int {
	if i < r.coldLen {
		return 0
	}
	s := &r.slots[i-r.coldLen]
	if s.payload == nil {
		return 0
	}
	n := int(s.size)
	s.payload, s.size = nil, 0
	r.cool(i)
	return n
}

// ClearBelow forgets the payloads of the records before seq q in r's
// arrays, which a state that already dropped them no longer reads, so
// that they are garbage now rather than when the array is next copied.
// r is a copy taken before the drop; the caller owns every state sharing
// its arrays (a private replay, package participant).
func (r Retention) ClearBelow(q oplog.Seq) {
	hot := r.first + oplog.Seq(r.coldLen)
	for i := range r.slots {
		if hot+oplog.Seq(i) >= q {
			return
		}
		r.slots[i] = slot{}
	}
}
