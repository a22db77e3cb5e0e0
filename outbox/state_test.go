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
	if a.st.Records.Len() != 0 {
		t.Fatalf("setup: %d records retained after every join was acknowledged", a.st.Records.Len())
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
	if n := a.st.Records.Len(); n != 0 {
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
	if n, b := a.st.Records.Len(), a.st.PayloadBytes; n != 0 || b != 0 {
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
		rec, _ := a.st.Record(q)
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
	if a.st.PayloadBytes != 0 || a.st.EvictedBytes != 0 || a.st.Records.Len() != 0 {
		t.Errorf("after the ack: PayloadBytes %d, EvictedBytes %d, %d records, want all 0", a.st.PayloadBytes, a.st.EvictedBytes, a.st.Records.Len())
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
	if n := a.st.Records.Len(); n != 0 {
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
		rec, _ := a.st.Record(q)
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
			if got, ok := a.st.Record(rec.Seq); ok && !slices.Equal(got.Recipients(), rec.Recipients) {
				t.Fatalf("record %v retained with recipients %v, projected with %v", rec.Seq, got.Recipients(), rec.Recipients)
			}
		}
	}
}

// TestRetention_ARecordIsSixteenBytes pins what a retained record costs
// on its own: a conversation may retain up to its backlog limit of them
// (65,536 by default), and a checkpoint derivation holds them once more
// while it runs. A Retained of its own was 96 bytes, then 48.
func TestRetention_ARecordIsSixteenBytes(t *testing.T) {
	// A payload pointer, its length and the source's offset: 16 bytes
	// where a pointer is 8.
	if got, want := unsafe.Sizeof(slot{}), unsafe.Sizeof(uintptr(0))+8; got != want {
		t.Errorf("a retained record's slot is %d bytes, want %d", got, want)
	}
}

// TestRetention_OneSendersTellsAreOneRun checks that a recipient that never
// reads costs 16 bytes a record, not a run each: every tell of one sender
// under one membership joins the run before it, however many are retained,
// and a derivation loading them (Retain) makes one run too.
func TestRetention_OneSendersTellsAreOneRun(t *testing.T) {
	a := newApplier(t, 2)
	for range 10000 {
		a.tell(0, []byte("to a deaf reader"))
	}
	if n, runs := a.st.Records.Len(), len(a.st.Records.runs); n != 10000 || runs != 1 {
		t.Errorf("%d records retained in %d runs, want 10000 in 1", n, runs)
	}
	var loaded State
	loaded.Members = a.st.Members
	for _, r := range a.st.Records.All() {
		loaded.Retain(r.Record(), r.Source)
	}
	if n, runs := loaded.Records.Len(), len(loaded.Records.runs); n != 10000 || runs != 1 {
		t.Errorf("loaded: %d records in %d runs, want 10000 in 1", n, runs)
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
			var st State
			st.Retain(rec, 11)
			st.Records.HoldPayload(0, tc.payload)
			r := st.Records.At(0)
			got := r.Payload()
			if (got == nil) != (tc.payload == nil) || !bytes.Equal(got, tc.payload) {
				t.Errorf("Payload() = %#v, want %#v", got, tc.payload)
			}
			if r.PayloadLen() != len(tc.payload) || r.Source != 11 || r.Evicted {
				t.Errorf("PayloadLen() = %d, Source = %d, Evicted %v, want %d, 11, false", r.PayloadLen(), r.Source, r.Evicted, len(tc.payload))
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
	i := int(q - a.st.Records.First())
	if r := a.st.Records.At(i); !r.Evicted || r.Payload() != nil || r.PayloadLen() != 12 {
		t.Errorf("evicted: Evicted %v, Payload() %q, PayloadLen() %d, want true, nil, 12", r.Evicted, r.Payload(), r.PayloadLen())
	}
	if n, r := a.st.Records.DropPayload(i), a.st.Records.At(i); n != 0 || !r.Evicted || r.PayloadLen() != 12 {
		t.Errorf("DropPayload() of an evicted record = %d, then Evicted %v, PayloadLen() %d; want 0, true, 12", n, r.Evicted, r.PayloadLen())
	}
	a.st.Records.HoldPayload(i, []byte("twelve bytes"))
	if r := a.st.Records.At(i); r.Evicted || string(r.Payload()) != "twelve bytes" {
		t.Errorf("held again: Evicted %v, Payload() %q", r.Evicted, r.Payload())
	}
	if n, r := a.st.Records.DropPayload(i), a.st.Records.At(i); n != 12 || r.Payload() != nil || r.Evicted {
		t.Errorf("DropPayload() = %d, then Payload() %q, Evicted %v; want 12, nil, false", n, r.Payload(), r.Evicted)
	}
}

// TestRetention_SourcesFourBillionRowsApartAreKept checks a source too far
// past the oldest retained record's for an offset, kept aside, through
// appends, a clone's, reclaiming and the copy that moves the records to
// arrays of their own.
func TestRetention_SourcesFourBillionRowsApartAreKept(t *testing.T) {
	var st State
	sources := []uint64{5, 6, 5 + 1<<32, 7 + 1<<33, 8 + 1<<33, 1 << 40}
	for i, src := range sources {
		st.Retain(Record{Seq: oplog.Seq(i + 1), Kind: KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{0}}, src)
	}
	clone := st.Clone()
	clone.Retain(Record{Seq: 7, Kind: KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{0}}, 1<<41)
	check := func(name string, st *State, want []uint64) {
		t.Helper()
		for i, r := range st.Records.All() {
			if r.Source != want[i] {
				t.Errorf("%s: record %v from row %d, want %d", name, r.Seq, r.Source, want[i])
			}
		}
		if st.Records.Len() != len(want) {
			t.Errorf("%s: %d records, want %d", name, st.Records.Len(), len(want))
		}
	}
	check("original", &st, sources)
	check("clone", clone, append(slices.Clone(sources), 1<<41))
	clone.Records.dropFirst(2)
	clone.Records.compact()
	check("compacted", clone, append(slices.Clone(sources[2:]), 1<<41))
	check("original after the clone's compaction", &st, sources)
}

// retentionBytes is what r's arrays hold in all: slots, runs and spans.
func retentionBytes(r *Retention) int {
	return cap(r.slots)*int(unsafe.Sizeof(slot{})) + cap(r.runs)*int(unsafe.Sizeof(run{})) + cap(r.cold)*int(unsafe.Sizeof(coldSpan{}))
}

// TestRetention_AnEvictedBacklogHoldsNoSlots tells a recipient that never
// reads 65,536 records, evicting every payload past a window of 16 as the
// live path does, and checks that the records past the window cost
// nothing each: one span, and the window's slots. A derivation's records,
// retained without payloads (Retain, then DropPayload of each one a row
// produces), are one span too. Before, each was a 16-byte slot: 1 MiB,
// and twice that while the array doubled, at the backlog limit.
func TestRetention_AnEvictedBacklogHoldsNoSlots(t *testing.T) {
	const n, window, size = 1 << 16, 16, 64
	a := newApplier(t, 2)
	for range n {
		a.tell(0, make([]byte, size))
		if a.st.PayloadBytes > window*size {
			a.st.Evict(a.st.PayloadBytes - window*size)
		}
	}
	r := &a.st.Records
	if r.Len() != n || a.st.PayloadBytes != window*size || a.st.EvictedBytes != (n-window)*size {
		t.Fatalf("%d records, %d payload bytes held, %d evicted; want %d, %d, %d", r.Len(), a.st.PayloadBytes, a.st.EvictedBytes, n, window*size, (n-window)*size)
	}
	if b := retentionBytes(r); b > 4<<10 {
		t.Errorf("%d records, %d of them evicted, hold %d bytes of slots, runs and spans (%d slots, %d spans), want at most 4 KiB",
			n, n-window, b, len(r.slots), len(r.cold))
	}
	for i, rec := range r.All() {
		if want := i < n-window; rec.Evicted != want || rec.PayloadLen() != size || rec.Seq != r.First()+oplog.Seq(i) {
			t.Fatalf("record %d: %+v, want evicted %v, %d bytes", i, rec, want, size)
		}
		if i > 0 {
			prev := r.At(i - 1)
			if rec.Source != prev.Source+1 {
				t.Fatalf("record %d: source %d after %d", i, rec.Source, prev.Source)
			}
		}
	}

	// A derivation: the records loaded without payloads, then rows
	// replayed, each record's payload dropped once produced.
	da := &applier{t: t}
	da.st = State{Applied: a.st.Applied, Produced: a.st.Produced, LastSeq: a.st.LastSeq, Members: slices.Clone(a.st.Members)}
	for _, rec := range r.All() {
		da.st.Retain(rec.Record(), rec.Source)
	}
	d := &da.st
	for range 1024 {
		da.tell(0, make([]byte, size))
		d.PayloadBytes -= int64(d.Records.DropPayload(d.Records.Len() - 1))
	}
	if b := retentionBytes(&d.Records); d.Records.Len() != n+1024 || b > 4<<10 {
		t.Errorf("a derivation's %d records (want %d) hold %d bytes of slots, runs and spans (%d slots, %d spans), want at most 4 KiB",
			d.Records.Len(), n+1024, b, len(d.Records.slots), len(d.Records.cold))
	}
}
