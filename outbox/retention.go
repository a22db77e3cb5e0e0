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
// here is what a deaf reader costs. A record is 16 bytes: its payload, as
// a pointer and a length, and the oplog row that produced it, as an offset
// from a base. Its seq is its place. What records told in a row share, the
// subject, kind, cause and recipient list, is held once per run of records
// that share it: a deaf reader's backlog of one sender's tells is one run,
// however long.
//
// The arrays are shared with the clones of the state (State.Clone): only
// their ends are appended to, and no element below a clone's length is
// written except by Evict, DropPayload, HoldPayload and ClearBelow, whose
// callers own every state sharing them.
type Retention struct {
	// first is the seq of slots[0]; meaningless while slots is empty.
	first oplog.Seq
	slots []slot
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
	// garbage counts the slots and runs dropped since the arrays were
	// last copied: the arrays the slices slide along still hold them.
	garbage, garbageRuns int
	garbageBytes         int64
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
func (r *Retention) Len() int { return len(r.slots) }

// First is the seq of the oldest record retained, 0 when none is.
func (r *Retention) First() oplog.Seq {
	if len(r.slots) == 0 {
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
	if len(r.slots) == 0 || q < r.first || q-r.first >= oplog.Seq(len(r.slots)) {
		return Retained{}, false
	}
	return r.At(int(q - r.first)), true
}

// All yields the records retained with their places, oldest first.
func (r *Retention) All() iter.Seq2[int, Retained] {
	return func(yield func(int, Retained) bool) {
		if len(r.slots) == 0 {
			return
		}
		k := r.runOf(r.first)
		for i := range r.slots {
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
	return r.first + oplog.Seq(len(r.slots))
}

func (r *Retention) view(i int, ru *run) Retained {
	s := &r.slots[i]
	q := r.first + oplog.Seq(i)
	return Retained{Seq: q, Participant: ru.participant, Source: r.source(q, s), recipients: ru.recipients,
		payload: s.payload, size: s.size, Kind: ru.kind, Cause: ru.cause, Evicted: s.payload == nil && s.size > 0}
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
	if len(r.slots) == 0 {
		r.first, r.base = q, source
	} else if want := r.first + oplog.Seq(len(r.slots)); q != want {
		panic(fmt.Sprintf("outbox: record %v retained after %v", q, want-1))
	}
	if n := len(r.runs); n == 0 || !r.runs[n-1].holds(participant, recipients, kind, cause) {
		if len(r.slots) == 0 {
			// Nothing is left of the runs before: slide past them.
			r.runs, r.garbageRuns = r.runs[n:], r.garbageRuns+n
		}
		r.runs = append(r.runs, run{seq: q, participant: participant, recipients: recipients, kind: kind, cause: cause})
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

// Reserve makes room for n more records without growing the array as
// appends do (a load that knows how many records it retains).
func (r *Retention) Reserve(n int) {
	if n > cap(r.slots)-len(r.slots) {
		r.slots = slices.Grow(r.slots, n)
	}
}

// dropFirst drops the n oldest records and returns the payload bytes
// they held in memory and the bytes evicted from them.
func (r *Retention) dropFirst(n int) (held, evicted int64) {
	for i := range n {
		switch s := &r.slots[i]; {
		case s.payload != nil:
			held += int64(s.size)
		case s.size > 0:
			evicted += int64(s.size)
		}
	}
	if n == 0 {
		return 0, 0
	}
	// The dropped prefix is not cleared: a clone may share it with the
	// published state. The arrays stay referenced while the slices move
	// along them, so once what they hold for nothing outweighs what is
	// live, the live part moves to arrays of its own (amortized: a copy
	// of k records follows at least k, or compactGarbageBytes, dropped).
	r.slots = r.slots[n:]
	r.first += oplog.Seq(n)
	r.garbage += n
	r.garbageBytes += held
	k := 0
	if len(r.slots) > 0 {
		k = r.runOf(r.first)
	} else if len(r.runs) > 0 {
		k = len(r.runs) - 1 // the last run may go on with the next record
	}
	r.runs = r.runs[k:]
	r.garbageRuns += k
	if r.garbage >= max(len(r.slots), 64) || r.garbageBytes >= compactGarbageBytes || r.garbageRuns >= max(len(r.runs), 64) {
		r.compact()
	}
	return held, evicted
}

// compact moves the live records to arrays of their own, their sources
// offset from the oldest one's.
func (r *Retention) compact() {
	slots := make([]slot, len(r.slots), len(r.slots)+len(r.slots)/4+8)
	var far map[oplog.Seq]uint64
	if len(r.slots) > 0 {
		base := r.source(r.first, &r.slots[0])
		for i := range r.slots {
			q := r.first + oplog.Seq(i)
			src := r.source(q, &r.slots[i])
			slots[i] = r.slots[i]
			if off := src - base; off < farSource {
				slots[i].source = uint32(off)
			} else {
				if far == nil {
					far = make(map[oplog.Seq]uint64)
				}
				slots[i].source, far[q] = farSource, src
			}
		}
		r.base = base
	}
	r.slots, r.far = slots, far
	r.runs = append(make([]run, 0, len(r.runs)+len(r.runs)/4+4), r.runs...)
	r.garbage, r.garbageRuns, r.garbageBytes = 0, 0, 0
}

// HoldPayload holds p, read back from oplog row Source, as the payload of
// the i-th record, retained without it (a start loading a checkpoint's
// records). The caller owns every state sharing r.
func (r *Retention) HoldPayload(i int, p []byte) {
	if uint64(len(p)) > math.MaxUint32 {
		panic(fmt.Sprintf("outbox: a payload of %d bytes (a msgpack bin holds less than 4 GiB)", len(p)))
	}
	r.slots[i].payload, r.slots[i].size = unsafe.SliceData(p), uint32(len(p))
}

// DropPayload forgets the payload the i-th record holds without marking it
// evicted (a replay that reads no payload, package participant) and
// returns its length; an evicted record is left as it is. The caller owns
// every state sharing r.
func (r *Retention) DropPayload(i int) int {
	s := &r.slots[i]
	if s.payload == nil {
		return 0
	}
	n := int(s.size)
	s.payload, s.size = nil, 0
	return n
}

// ClearBelow forgets the payloads of the records before seq q in r's
// arrays, which a state that already dropped them no longer reads, so
// that they are garbage now rather than when the array is next copied.
// r is a copy taken before the drop; the caller owns every state sharing
// its arrays (a private replay, package participant).
func (r Retention) ClearBelow(q oplog.Seq) {
	for i := range r.slots {
		if r.first+oplog.Seq(i) >= q {
			return
		}
		r.slots[i] = slot{}
	}
}
