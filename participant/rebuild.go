package participant

import (
	"time"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// rebuilder advances a private state row by row through the same pure code
// as the live path (outbox.Apply on the rows outbox.Project derived), and,
// when pos is set, tracks what a checkpoint needs besides the state: where
// each unreclaimed record was produced, and compaction marks.
type rebuilder struct {
	state *outbox.State
	// pos holds the rows that produced each unreclaimed record; nil when
	// not tracking. Payloads are then dropped from the state, since a
	// checkpoint names their rows instead of holding them.
	pos map[Seq]recordPos
	// marks are the compaction marks so far, oldest first; spacing (unix
	// ms) keeps them sparse: a new mark closer than spacing to the one
	// before the last replaces the last, which only delays compaction.
	marks   []checkpoint.Mark
	spacing int64
}

// recordPos is where a record was produced: its oplog and outbox rows.
type recordPos struct {
	oplog, outbox uint64
}

// firstKept returns the seq of the first record st retains, LastSeq+1 when
// it retains none.
func firstKept(st *outbox.State) Seq {
	if len(st.Records) > 0 {
		return st.Records[0].Seq
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
	for k := range before {
		if before[k].Seq >= kept {
			break
		}
		before[k] = outbox.Retained{}
	}
	if rp.pos == nil {
		return
	}
	for k := range expected {
		for _, rec := range expected[k].Records {
			rp.pos[rec.Seq] = recordPos{oplog: i, outbox: outboxIdx + uint64(k)}
		}
	}
	for k := range st.Records {
		st.Records[k].Payload = nil
	}
	if kept == beforeFirst {
		return
	}
	for q := beforeFirst; q < kept; q++ {
		delete(rp.pos, q)
	}
	m := checkpoint.Mark{At: row.At, Oplog: st.Applied, Outbox: st.Produced}
	if p, ok := rp.pos[kept]; ok {
		m.Oplog, m.Outbox = p.oplog, p.outbox
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
