package participant

import (
	"fmt"
	"sort"
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// rebuilder advances a private state row by row through the same pure code
// as the live path (outbox.Apply on the rows outbox.Project derived), and,
// when track is set, tracks what a checkpoint needs besides the state:
// the outbox row each unreclaimed record was produced in (its oplog row is
// its Source), and compaction marks.
type rebuilder struct {
	state *outbox.State
	// track is set to derive a checkpoint: pos holds the outbox rows of
	// the unreclaimed records, and payloads are dropped from the state,
	// since a checkpoint names their rows instead of holding them.
	track bool
	pos   positions
	// window, when not 0 and not tracking, bounds the payload bytes the
	// state keeps: past it the oldest are evicted after each row, to be
	// read back from their oplog rows, as the live state's are.
	window int64
	// marks are the compaction marks so far, oldest first; spacing (unix
	// ms) keeps them sparse: a new mark closer than spacing to the one
	// before the last replaces the last, which only delays compaction.
	marks   []checkpoint.Mark
	spacing int64
}

// positions holds the outbox row that produced each of a run of
// contiguous records, as spans: the records of a span were produced one a
// row in consecutive outbox rows, so a stream of tells, however long, is
// one span of 16 bytes. A record sharing its row with the one before (an
// enroll's) or not in the row after it begins a span of its own.
type positions struct {
	// spans are ascending by seq: span k holds the records from its seq
	// to the one before span k+1's, the last one's to end-1.
	spans []span
	// end is the seq after the last record held, while spans is not empty.
	end Seq
	// dropped counts the spans dropped from the front since spans moved
	// to an array of its own: the array still holds them.
	dropped int
}

// span is a run of records produced in consecutive outbox rows: record q
// of it was produced in row row+(q-seq).
type span struct {
	seq Seq
	row uint64
}

// add records that record q was produced in outbox row row. Records are
// added in seq order, without gaps while any is held; anything else is a
// broken invariant of the replay.
func (p *positions) add(q Seq, row uint64) {
	n := len(p.spans)
	switch {
	case n == 0:
	case q != p.end:
		panic(fmt.Sprintf("participant: record %v produced after %v", q, p.end-1))
	case p.spans[n-1].row+uint64(q-p.spans[n-1].seq) == row:
		p.end++
		return
	}
	p.spans = append(p.spans, span{seq: q, row: row})
	p.end = q + 1
}

// dropBelow forgets the records below seq q.
func (p *positions) dropBelow(q Seq) {
	if len(p.spans) == 0 || q <= p.spans[0].seq {
		return
	}
	if q >= p.end {
		p.spans, p.dropped = p.spans[len(p.spans):], p.dropped+len(p.spans)
	} else {
		k := p.spanOf(q)
		p.spans, p.dropped = p.spans[k:], p.dropped+k
		// The array is the rebuilder's alone: the span holding q now
		// begins at q.
		p.spans[0].row += uint64(q - p.spans[0].seq)
		p.spans[0].seq = q
	}
	if p.dropped >= max(len(p.spans), 1024) {
		p.spans, p.dropped = append(make([]span, 0, len(p.spans)+len(p.spans)/4+8), p.spans...), 0
	}
}

// spanOf returns the index of the span holding record q, which is held.
func (p *positions) spanOf(q Seq) int {
	return sort.Search(len(p.spans), func(k int) bool { return p.spans[k].seq > q }) - 1
}

// row returns the outbox row of record q, if held.
func (p *positions) row(q Seq) (uint64, bool) {
	if len(p.spans) == 0 || q < p.spans[0].seq || q >= p.end {
		return 0, false
	}
	sp := &p.spans[p.spanOf(q)]
	return sp.row + uint64(q-sp.seq), true
}

// firstKept returns the seq of the first record st retains, LastSeq+1 when
// it retains none.
func firstKept(st *outbox.State) Seq {
	if st.Records.Len() > 0 {
		return st.Records.First()
	}
	return st.LastSeq + 1
}

// apply applies oplog row i and its projected rows. Records reclaimed by
// the row are cleared from the previous backing array at once, so their
// payloads are garbage now rather than when append next reallocates: the
// state is private, nothing shares the array.
func (rp *rebuilder) apply(i uint64, row *oplog.Row, expected []outbox.Row) {
	st := rp.state
	before, beforeFirst, outboxIdx := st.Records, firstKept(st), st.Produced
	outbox.Apply(st, i, row, expected)
	kept := firstKept(st)
	before.ClearBelow(kept)
	if !rp.track {
		if rp.window > 0 && st.PayloadBytes > rp.window {
			st.Evict(st.PayloadBytes - rp.window)
		}
		return
	}
	produced := 0
	for k := range expected {
		for _, rec := range expected[k].Records {
			rp.pos.add(rec.Seq, outboxIdx+uint64(k))
			produced++
		}
	}
	// Only the records this row produced hold a payload: every earlier
	// one was dropped when it was produced, and is no longer counted.
	for k := max(st.Records.Len()-produced, 0); k < st.Records.Len(); k++ {
		st.PayloadBytes -= int64(st.Records.DropPayload(k))
	}
	if kept == beforeFirst {
		return
	}
	rp.pos.dropBelow(kept)
	m := checkpoint.Mark{At: row.At, Oplog: st.Applied, Outbox: st.Produced}
	if p, ok := rp.pos.row(kept); ok {
		m.Oplog, m.Outbox = st.Records.At(0).Source, p
	}
	rp.addMark(m)
}

func (rp *rebuilder) addMark(m checkpoint.Mark) {
	n := len(rp.marks)
	if n > 0 && (m.At < rp.marks[n-1].At || m.Oplog < rp.marks[n-1].Oplog || m.Outbox < rp.marks[n-1].Outbox) {
		// Commit times come from the wall clock, which may step back;
		// marks stay monotonic by keeping the older, smaller one.
		return
	}
	if n >= 2 && m.At-rp.marks[n-2].At < rp.spacing {
		rp.marks[n-1] = m
		return
	}
	rp.marks = append(rp.marks, m)
}

// pruneMarks drops the marks that compaction can no longer use: of the
// marks at or before now-retain, only the newest counts.
func pruneMarks(marks []checkpoint.Mark, now time.Time, retain time.Duration) []checkpoint.Mark {
	cutoff := now.Add(-retain).UnixMilli()
	old := 0
	for old < len(marks) && marks[old].At <= cutoff {
		old++
	}
	if old <= 1 {
		return marks
	}
	return append([]checkpoint.Mark(nil), marks[old-1:]...)
}
