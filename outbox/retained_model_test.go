package outbox

import (
	"bytes"
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
		var junk [][]byte
		for step := range steps {
			live := []oplog.ParticipantID{}
			for i, m := range a.st.Members {
				if !m.Retired {
					live = append(live, oplog.ParticipantID(i))
				}
			}
			var row *oplog.Row
			switch x := rng.IntN(40); {
			case x == 0 || len(live) < 2:
				p := oplog.ParticipantID(len(a.st.Members))
				row = &oplog.Row{Kind: oplog.KindEnroll, Participant: p, Generation: 1, Conn: oplog.ConnID{Server: 1, Ordinal: uint64(p) + 1}}
			case x == 1:
				row = &oplog.Row{Kind: oplog.KindLeave, Participant: live[rng.IntN(len(live))], Generation: 1}
			case x < 12:
				p := live[rng.IntN(len(live))]
				var to []oplog.Seq
				for i := range a.st.Records {
					if r := &a.st.Records[i]; r.Seq > a.st.Members[p].Cursor && r.Addressed(p) {
						to = append(to, r.Seq)
					}
				}
				if len(to) > 0 {
					a.ack(p, to[rng.IntN(len(to))])
				}
			case x < 15:
				need := int64(rng.IntN(200))
				held := func() (n int64) {
					for i := range a.st.Records {
						if r := &a.st.Records[i]; !r.Evicted && r.Payload() != nil {
							n += int64(len(r.Payload()))
						}
					}
					return n
				}
				freed := a.st.Evict(need)
				var newly int64
				for i := range a.st.Records {
					r := &a.st.Records[i]
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
					for i := range a.st.Records {
						if r := &a.st.Records[i]; r.Seq <= a.st.evicted && !r.Evicted && len(r.Payload()) > 0 {
							t.Fatalf("seed %d step %d: Evict(%d) freed %d and left record %v's payload held", seed, step, need, freed, r.Seq)
						}
					}
				}
			case x == 15 && len(a.st.Records) > 0:
				// A rebuilder dropping what it will not publish.
				k := rng.IntN(len(a.st.Records))
				r := &a.st.Records[k]
				m := ref[r.Seq]
				want := 0
				if !m.evicted && !m.dropped && !m.isNil {
					want = len(m.payload)
				}
				n := r.DropPayload()
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
				if r.Kind != oplog.KindAck {
					r.Seq = a.st.LastSeq + 1
				}
				idx := a.st.Applied
				rows, err := Project(&a.st, idx, &r)
				if err != nil {
					t.Fatalf("seed %d step %d: Project(%v): %v", seed, step, r.Kind, err)
				}
				for _, o := range rows {
					for _, rec := range o.Records {
						m := &refRetained{kind: rec.Kind, recipients: slices.Clone(rec.Recipients), isNil: true}
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
			for i := range a.st.Records {
				r := &a.st.Records[i]
				m, ok := ref[r.Seq]
				if !ok {
					t.Fatalf("seed %d step %d: record %v retained but never projected", seed, step, r.Seq)
				}
				if r.Kind != m.kind || !slices.Equal(r.Recipients(), m.recipients) {
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
			if a.st.PayloadBytes != held || a.st.EvictedBytes != evicted {
				t.Fatalf("seed %d step %d: PayloadBytes %d, EvictedBytes %d; the retained records hold %d and evicted %d", seed, step, a.st.PayloadBytes, a.st.EvictedBytes, held, evicted)
			}
		}
		runtime.KeepAlive(junk)
	}
}
