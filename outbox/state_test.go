package outbox

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/participantd/participantd/oplog"
)

// applier drives a State through oplog rows, as the participant service
// does: Project, then Apply.
type applier struct {
	t  *testing.T
	st State
}

func (a *applier) apply(r oplog.Row) {
	a.t.Helper()
	idx := a.st.Applied
	if r.Kind != oplog.KindGenesis && r.Kind != oplog.KindAck {
		r.Seq = a.st.LastSeq + 1
		if r.Kind == oplog.KindAttach && a.st.Members[r.Participant].Bound {
			r.Seq++
		}
	}
	rows, err := Project(&a.st, idx, &r)
	if err != nil {
		a.t.Fatalf("Project(%v at %d): %v", r.Kind, idx, err)
	}
	Apply(&a.st, idx, &r, rows)
}

// newApplier enrolls members participants and has each acknowledge the
// joins it saw, so that the state retains no record.
func newApplier(t *testing.T, members int) *applier {
	a := &applier{t: t}
	a.apply(oplog.Row{Kind: oplog.KindGenesis})
	for i := range members {
		a.apply(oplog.Row{Kind: oplog.KindEnroll, Participant: oplog.ParticipantID(i), Generation: 1, Conn: oplog.ConnID{Server: 1, Ordinal: uint64(i + 1)}})
	}
	for i := range members - 1 {
		a.ack(oplog.ParticipantID(i), a.st.LastSeq)
	}
	if len(a.st.Records) != 0 {
		t.Fatalf("setup: %d records retained after every join was acknowledged", len(a.st.Records))
	}
	return a
}

func (a *applier) tell(p oplog.ParticipantID, payload []byte) oplog.Seq {
	a.apply(oplog.Row{Kind: oplog.KindTell, Participant: p, Generation: 1, Payload: payload})
	return a.st.LastSeq
}

func (a *applier) ack(p oplog.ParticipantID, through oplog.Seq) {
	a.apply(oplog.Row{Kind: oplog.KindAck, Participant: p, Generation: 1, Through: through})
}

func TestApply_RecordsAddressedToNobodyAreReclaimedAtOnce(t *testing.T) {
	a := newApplier(t, 1)
	for range 100 {
		a.tell(0, make([]byte, 1000))
	}
	if n := len(a.st.Records); n != 0 {
		t.Errorf("a lone member's 100 tells left %d records retained, want 0", n)
	}
	if a.st.PayloadBytes != 0 {
		t.Errorf("PayloadBytes = %d, want 0", a.st.PayloadBytes)
	}
}

func TestApply_PayloadBytesFollowTheRetainedRecords(t *testing.T) {
	a := newApplier(t, 2)
	var last oplog.Seq
	for range 10 {
		last = a.tell(0, make([]byte, 100))
	}
	if got, want := a.st.PayloadBytes, int64(1000); got != want {
		t.Errorf("PayloadBytes after 10 tells of 100 bytes = %d, want %d", got, want)
	}
	a.ack(1, last)
	if n, b := len(a.st.Records), a.st.PayloadBytes; n != 0 || b != 0 {
		t.Errorf("after the recipient acknowledged everything: %d records, %d bytes retained, want 0, 0", n, b)
	}
}

func TestEvict_DropsOldestPayloadsAndKeepsMetadata(t *testing.T) {
	a := newApplier(t, 2)
	var seqs []oplog.Seq
	for i := range 10 {
		seqs = append(seqs, a.tell(0, make([]byte, 100+i)))
	}
	before := a.st.PayloadBytes
	freed := a.st.Evict(250)
	if want := int64(100 + 101 + 102); freed != want {
		t.Errorf("Evict(250) = %d, want %d (the three oldest payloads)", freed, want)
	}
	if a.st.PayloadBytes != before-freed || a.st.EvictedBytes != freed {
		t.Errorf("after Evict: PayloadBytes = %d, EvictedBytes = %d, want %d, %d", a.st.PayloadBytes, a.st.EvictedBytes, before-freed, freed)
	}
	for i, q := range seqs {
		rec := a.st.Record(q)
		if evicted := i < 3; rec.Evicted != evicted || (rec.Payload() == nil) != evicted {
			t.Errorf("record %v: Evicted = %v, payload held = %v, want evicted %v", q, rec.Evicted, rec.Payload() != nil, evicted)
		}
		if rec.Source == 0 {
			t.Errorf("record %v has no source row", q)
		}
	}
	// Evict continues where it stopped.
	if freed := a.st.Evict(1); freed != 103 {
		t.Errorf("second Evict(1) = %d, want 103", freed)
	}
	a.ack(1, seqs[len(seqs)-1])
	if a.st.PayloadBytes != 0 || a.st.EvictedBytes != 0 || len(a.st.Records) != 0 {
		t.Errorf("after the ack: PayloadBytes %d, EvictedBytes %d, %d records, want all 0", a.st.PayloadBytes, a.st.EvictedBytes, len(a.st.Records))
	}
}

func TestReclaim_FreesThePayloadsOfACaughtUpBacklog(t *testing.T) {
	a := newApplier(t, 2)
	var last oplog.Seq
	for range 1000 {
		last = a.tell(0, make([]byte, 10<<10))
	}
	before := heapAlloc()
	a.ack(1, last)
	after := heapAlloc()
	// 10 MiB of payloads were reclaimed: the array the records slid along
	// must not keep them.
	if before < after || before-after < 8<<20 {
		t.Errorf("acknowledging a 10 MiB backlog freed %.1f MiB of heap, want >= 8 MiB", (float64(before)-float64(after))/(1<<20))
	}
	if n := len(a.st.Records); n != 0 {
		t.Errorf("%d records retained, want 0", n)
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func TestApply_RecordsOfOneSubjectShareTheirRecipientList(t *testing.T) {
	a := newApplier(t, 100)
	var first *oplog.ParticipantID
	for range 1000 {
		q := a.tell(0, []byte("x"))
		rec := a.st.Record(q)
		if len(rec.Recipients()) != 99 {
			t.Fatalf("record %v has %d recipients, want 99", q, len(rec.Recipients()))
		}
		if first == nil {
			first = &rec.Recipients()[0]
		} else if &rec.Recipients()[0] != first {
			t.Fatalf("record %v holds its own copy of the recipient list", q)
		}
	}
}

// TestApply_InternedRecipientsMatchTheProjection drives a conversation
// through random enrolls, leaves and tells and checks that every retained
// record's recipients are exactly those its outbox row was projected with.
func TestApply_InternedRecipientsMatchTheProjection(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	a := newApplier(t, 3)
	for range 3000 {
		live := []oplog.ParticipantID{}
		for i, m := range a.st.Members {
			if !m.Retired {
				live = append(live, oplog.ParticipantID(i))
			}
		}
		var r oplog.Row
		switch x := rng.IntN(20); {
		case x == 0 || len(live) < 2:
			p := oplog.ParticipantID(len(a.st.Members))
			r = oplog.Row{Kind: oplog.KindEnroll, Participant: p, Generation: 1, Conn: oplog.ConnID{Server: 1, Ordinal: uint64(p) + 1}}
		case x == 1:
			r = oplog.Row{Kind: oplog.KindLeave, Participant: live[rng.IntN(len(live))], Generation: 1}
		default:
			r = oplog.Row{Kind: oplog.KindTell, Participant: live[rng.IntN(len(live))], Generation: 1, Payload: []byte("p")}
		}
		idx := a.st.Applied
		r.Seq = a.st.LastSeq + 1
		rows, err := Project(&a.st, idx, &r)
		if err != nil {
			t.Fatalf("Project(%v): %v", r.Kind, err)
		}
		Apply(&a.st, idx, &r, rows)
		for _, rec := range rows[0].Records {
			if got := a.st.Record(rec.Seq); got != nil && !slices.Equal(got.Recipients(), rec.Recipients) {
				t.Fatalf("record %v retained with recipients %v, projected with %v", rec.Seq, got.Recipients(), rec.Recipients)
			}
		}
	}
}

// TestRetained_IsFortyEightBytes pins the size of a retained record's
// metadata: a conversation may retain up to its backlog limit of them (65,536
// by default), and a checkpoint derivation holds them once more while it
// runs. The embedded outbox.Record and a payload slice made it 96.
func TestRetained_IsFortyEightBytes(t *testing.T) {
	if got := unsafe.Sizeof(Retained{}); got != 48 {
		t.Errorf("a Retained is %d bytes, want 48", got)
	}
}

// TestRetained_KeepsWhatTheSliceFieldsKept checks that the compact form
// gives back what the fields it replaced held: a nil payload apart from an
// empty one, the payload's bytes, its length once evicted, and the
// record's recipients.
func TestRetained_KeepsWhatTheSliceFieldsKept(t *testing.T) {
	rec := Record{Seq: 7, Kind: KindRecord, Participant: 2, Cause: oplog.CauseNone, Recipients: []oplog.ParticipantID{0, 1, 3}}
	for _, tc := range []struct {
		name    string
		payload []byte
	}{{"nil", nil}, {"empty", []byte{}}, {"bytes", []byte("transfer 100 to alice")}} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRetained(rec, 11, tc.payload)
			got := r.Payload()
			if (got == nil) != (tc.payload == nil) || !bytes.Equal(got, tc.payload) {
				t.Errorf("Payload() = %#v, want %#v", got, tc.payload)
			}
			if r.PayloadLen() != len(tc.payload) || r.Source != 11 {
				t.Errorf("PayloadLen() = %d, Source = %d, want %d, 11", r.PayloadLen(), r.Source, len(tc.payload))
			}
			if back := r.Record(); !reflect.DeepEqual(back, rec) {
				t.Errorf("Record() = %+v, want %+v", back, rec)
			}
			if !r.Addressed(3) || r.Addressed(2) {
				t.Errorf("Addressed(3), Addressed(2) = %v, %v, want true, false", r.Addressed(3), r.Addressed(2))
			}
		})
	}
	a := newApplier(t, 2)
	q := a.tell(0, []byte("twelve bytes"))
	a.st.Evict(1)
	r := a.st.Record(q)
	if !r.Evicted || r.Payload() != nil || r.PayloadLen() != 12 {
		t.Errorf("evicted: Evicted %v, Payload() %q, PayloadLen() %d, want true, nil, 12", r.Evicted, r.Payload(), r.PayloadLen())
	}
	if n := r.DropPayload(); n != 0 || !r.Evicted || r.PayloadLen() != 12 {
		t.Errorf("DropPayload() of an evicted record = %d, then Evicted %v, PayloadLen() %d; want 0, true, 12", n, r.Evicted, r.PayloadLen())
	}
	r.HoldPayload([]byte("twelve bytes"))
	if r.Evicted || string(r.Payload()) != "twelve bytes" {
		t.Errorf("held again: Evicted %v, Payload() %q", r.Evicted, r.Payload())
	}
	if n := r.DropPayload(); n != 12 || r.Payload() != nil || r.Evicted {
		t.Errorf("DropPayload() = %d, then Payload() %q, Evicted %v; want 12, nil, false", n, r.Payload(), r.Evicted)
	}
}
