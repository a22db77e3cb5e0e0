package outbox

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/participantd/participantd/oplog"
)

// refRetained is what the 96-byte Retained (an embedded Record, a Payload
// slice, an evicted length) held for one record: the reference the
// compact form is checked against.
type refRetained struct {
	seq        oplog.Seq
	source     uint64
	kind       RecordKind
	recipients []oplog.ParticipantID
	payload    []byte // a copy; nil for a record without one
	isNil      bool
	evicted    bool
	dropped    bool
}

// TestRetained_MatchesTheSliceFormUnderRandomOperations drives a state
// through random tells (nil, empty and non-empty payloads, each a fresh
// allocation that nothing else references), acks, enrolls, leaves,
// evictions, a rebuilder's DropPayload and clone publications, collecting
// garbage and reusing the freed memory between steps, and checks every
// retained record and both byte counters against a reference model of
// the slice fields the compact form replaced.
func TestRetained_MatchesTheSliceFormUnderRandomOperations(t *testing.T) {
	steps := 4000
	if testing.Short() {
		steps = 1500
	}
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 99))
		a := newApplier(t, 3)
		ref := make(map[oplog.Seq]*refRetained)
		released := make(map[oplog.ParticipantID]oplog.Seq)
		var junk [][]byte
		for step := range steps {
			live := []oplog.ParticipantID{}
			for i, m := range a.st.Members {
				if !m.Retired {
					live = append(live, oplog.ParticipantID(i))
				}
			}
			var row *oplog.Row
			switch x := rng.IntN(44); {
			case x == 0 || len(live) < 2:
				p := oplog.ParticipantID(len(a.st.Members))
				row = &oplog.Row{Kind: oplog.KindEnroll, Participant: p, Generation: 1, Conn: oplog.ConnID{Server: 1, Ordinal: uint64(p) + 1}}
			case x == 1:
				row = &oplog.Row{Kind: oplog.KindLeave, Participant: live[rng.IntN(len(live))], Generation: 1}
			case x < 12:
				p := live[rng.IntN(len(live))]
				var to []oplog.Seq
				for _, r := range a.st.Records.All() {
					if r.Seq > a.st.Members[p].Cursor && r.Addressed(p) {
						to = append(to, r.Seq)
					}
				}
				if len(to) > 0 {
					a.ack(p, to[rng.IntN(len(to))])
				}
			case x < 15:
				need := int64(rng.IntN(200))
				held := func() (n int64) {
					for _, r := range a.st.Records.All() {
						if !r.Evicted && r.Payload() != nil {
							n += int64(len(r.Payload()))
						}
					}
					return n
				}
				freed := a.st.Evict(need)
				var newly int64
				for _, r := range a.st.Records.All() {
					m := ref[r.Seq]
					if r.Evicted && !m.evicted {
						if m.dropped || m.kind != KindRecord || len(m.payload) == 0 {
							t.Fatalf("seed %d step %d: record %v evicted, but it held no payload", seed, step, r.Seq)
						}
						m.evicted = true
						newly += int64(len(m.payload))
					}
				}
				if freed != newly {
					t.Fatalf("seed %d step %d: Evict(%d) = %d, the records it evicted held %d", seed, step, need, freed, newly)
				}
				if freed < need && held() > 0 {
					// Evict resumes past the last record it looked at;
					// every record held below that point was evicted.
					for _, r := range a.st.Records.All() {
						if r.Seq <= a.st.evicted && !r.Evicted && len(r.Payload()) > 0 {
							t.Fatalf("seed %d step %d: Evict(%d) freed %d and left record %v's payload held", seed, step, need, freed, r.Seq)
						}
					}
				}
			case x == 15 && a.st.Records.Len() > 0:
				// A rebuilder dropping what it will not publish.
				k := rng.IntN(a.st.Records.Len())
				r := a.st.Records.At(k)
				m := ref[r.Seq]
				want := 0
				if !m.evicted && !m.dropped && !m.isNil {
					want = len(m.payload)
				}
				n := a.st.Records.DropPayload(k)
				if n != want {
					t.Fatalf("seed %d step %d: DropPayload of record %v = %d, want %d", seed, step, r.Seq, n, want)
				}
				a.st.PayloadBytes -= int64(n)
				if !m.evicted {
					m.dropped = true
				}
			case x == 16:
				// A batch advances a clone and publishes it.
				c := a.st.Clone()
				a.st = *c
			case x == 17:
				// Four billion rows that produced no record: the sources
				// of what follows are too far for an offset from the
				// oldest retained record's.
				a.st.Applied += 1<<32 + uint64(rng.IntN(3))
			case x == 18 && a.st.Records.Len() > 0:
				// An operator releases the oldest records.
				q := a.st.Records.First() + oplog.Seq(rng.IntN(a.st.Records.Len()))
				row = &oplog.Row{Kind: oplog.KindRelease, Through: q}
				for _, r := range refRecords(ref, a.st.Records.First(), q) {
					for _, p := range r.recipients {
						if m := &a.st.Members[p]; !m.Retired && m.Cursor < r.seq {
							released[p] = r.seq
						}
					}
				}
			default:
				p := live[rng.IntN(len(live))]
				var payload []byte
				switch rng.IntN(4) {
				case 0:
				case 1:
					payload = []byte{}
				default:
					payload = make([]byte, 1+rng.IntN(96))
					for i := range payload {
						payload[i] = byte(rng.Uint32())
					}
				}
				row = &oplog.Row{Kind: oplog.KindTell, Participant: p, Generation: 1, Payload: payload}
			}
			if row != nil {
				r := *row
				if r.Kind != oplog.KindAck && r.Kind != oplog.KindRelease {
					r.Seq = a.st.LastSeq + 1
				}
				idx := a.st.Applied
				rows, err := Project(&a.st, idx, &r)
				if err != nil {
					t.Fatalf("seed %d step %d: Project(%v): %v", seed, step, r.Kind, err)
				}
				for _, o := range rows {
					for _, rec := range o.Records {
						m := &refRetained{seq: rec.Seq, source: idx, kind: rec.Kind, recipients: slices.Clone(rec.Recipients), isNil: true}
						if rec.Kind == KindRecord {
							m.payload, m.isNil = bytes.Clone(r.Payload), r.Payload == nil
						}
						ref[rec.Seq] = m
					}
				}
				Apply(&a.st, idx, &r, rows)
			}
			if step%64 == 0 {
				runtime.GC()
				junk = junk[:0]
				for range 256 {
					b := make([]byte, 1+rng.IntN(96))
					for i := range b {
						b[i] = 0xA5
					}
					junk = append(junk, b)
				}
			}
			var held, evicted int64
			for _, r := range a.st.Records.All() {
				m, ok := ref[r.Seq]
				if !ok {
					t.Fatalf("seed %d step %d: record %v retained but never projected", seed, step, r.Seq)
				}
				if r.Kind != m.kind || r.Source != m.source || !slices.Equal(r.Recipients(), m.recipients) {
					t.Fatalf("seed %d step %d: record %v is %v to %v, projected %v to %v", seed, step, r.Seq, r.Kind, r.Recipients(), m.kind, m.recipients)
				}
				if r.Evicted != m.evicted {
					t.Fatalf("seed %d step %d: record %v Evicted %v, want %v", seed, step, r.Seq, r.Evicted, m.evicted)
				}
				got := r.Payload()
				switch {
				case m.evicted:
					evicted += int64(len(m.payload))
					if got != nil || r.PayloadLen() != len(m.payload) {
						t.Fatalf("seed %d step %d: evicted record %v holds %q, PayloadLen %d, want nil, %d", seed, step, r.Seq, got, r.PayloadLen(), len(m.payload))
					}
				case m.dropped:
					if got != nil {
						t.Fatalf("seed %d step %d: dropped record %v holds %q", seed, step, r.Seq, got)
					}
				default:
					held += int64(len(m.payload))
					if (got == nil) != m.isNil || !bytes.Equal(got, m.payload) {
						t.Fatalf("seed %d step %d: record %v holds %#v (nil %v), want %#v (nil %v)", seed, step, r.Seq, got, got == nil, m.payload, m.isNil)
					}
				}
			}
			checkAgainstTheModel(t, &a.st, ref, released, func() string { return fmt.Sprintf("seed %d step %d", seed, step) })
			if a.st.PayloadBytes != held || a.st.EvictedBytes != evicted {
				t.Fatalf("seed %d step %d: PayloadBytes %d, EvictedBytes %d; the retained records hold %d and evicted %d", seed, step, a.st.PayloadBytes, a.st.EvictedBytes, held, evicted)
			}
		}
		runtime.KeepAlive(junk)
	}
}

// refRecords returns the records of the model from seq first through q.
func refRecords(ref map[oplog.Seq]*refRetained, first, q oplog.Seq) []*refRetained {
	var out []*refRetained
	for s := first; s <= q; s++ {
		out = append(out, ref[s])
	}
	return out
}

// checkAgainstTheModel checks what State answers from its runs against
// the record-by-record definitions: the oldest retained record is one a
// recipient still needs (reclaim went as far as it may), every record the
// model has below it was settled or released, Next and Record find what
// a walk over the records finds, and each member's Released is what a
// walk over the released records gave.
func checkAgainstTheModel(t *testing.T, st *State, ref map[oplog.Seq]*refRetained, released map[oplog.ParticipantID]oplog.Seq, where func() string) {
	t.Helper()
	settled := func(m *refRetained) bool {
		for _, p := range m.recipients {
			if mm := &st.Members[p]; !mm.Retired && mm.Cursor < m.seq {
				return false
			}
		}
		return true
	}
	first := st.LastSeq + 1
	if st.Records.Len() > 0 {
		first = st.Records.First()
		if settled(ref[first]) {
			t.Fatalf("%s: record %v is retained first, but every recipient has it", where(), first)
		}
		if last := first + oplog.Seq(st.Records.Len()) - 1; last != st.LastSeq {
			t.Fatalf("%s: records %v..%v retained, the last seq is %v", where(), first, last, st.LastSeq)
		}
	}
	for q, m := range ref {
		if q < first {
			delete(ref, q) // reclaimed or released: not retained again
		}
		_ = m
	}
	for i := range st.Members {
		p := oplog.ParticipantID(i)
		m := &st.Members[i]
		if want := released[p]; want <= m.Cursor {
			delete(released, p)
		}
		if want := released[p]; m.Released != want {
			t.Fatalf("%s: member %v Released %v, a walk over the released records gives %v", where(), p, m.Released, want)
		}
		for _, after := range []oplog.Seq{m.Cursor, 0, first, first + 1, st.LastSeq, st.LastSeq + 3} {
			var want *refRetained
			for q := max(after+1, first); q <= st.LastSeq; q++ {
				if slices.Contains(ref[q].recipients, p) {
					want = ref[q]
					break
				}
			}
			got, ok := st.Next(p, after)
			if ok != (want != nil) || ok && got.Seq != want.seq {
				t.Fatalf("%s: Next(%v, %v) = %v %v, a walk gives %+v", where(), p, after, got.Seq, ok, want)
			}
		}
	}
	for _, q := range []oplog.Seq{0, first - 1, first, (first + st.LastSeq) / 2, st.LastSeq, st.LastSeq + 1} {
		got, ok := st.Record(q)
		m, in := ref[q]
		if wantOK := in && q >= first && q <= st.LastSeq; ok != wantOK || ok && (got.Seq != q || got.Source != m.source || got.Kind != m.kind) {
			t.Fatalf("%s: Record(%v) = %+v %v, the model has %+v", where(), q, got, ok, m)
		}
	}
}
