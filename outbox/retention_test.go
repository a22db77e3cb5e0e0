package outbox

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/participantd/participantd/oplog"
)

// seen is everything a reader of a published state can observe of one
// retained record.
type seen struct {
	seq         oplog.Seq
	participant oplog.ParticipantID
	source      uint64
	kind        RecordKind
	cause       oplog.Cause
	recipients  []oplog.ParticipantID
	payload     *byte
	size        int
	evicted     bool
}

// look returns what a reader sees of st's retained records.
func look(st *State) []seen {
	var out []seen
	for i, r := range st.Records.All() {
		if want := st.Records.First() + oplog.Seq(i); r.Seq != want {
			panic(fmt.Sprintf("record %d of All has seq %v, want %v", i, r.Seq, want))
		}
		out = append(out, seen{r.Seq, r.Participant, r.Source, r.Kind, r.Cause, slices.Clone(r.Recipients()), r.payload, r.PayloadLen(), r.Evicted})
	}
	return out
}

// diffSeen returns the first difference between two looks, "" for none.
func diffSeen(got, want []seen) string {
	for i := range min(len(got), len(want)) {
		g, w := got[i], want[i]
		if g.seq != w.seq || g.participant != w.participant || g.source != w.source || g.kind != w.kind || g.cause != w.cause ||
			!slices.Equal(g.recipients, w.recipients) || g.payload != w.payload || g.size != w.size || g.evicted != w.evicted {
			return fmt.Sprintf("record %v is %+v, was %+v", w.seq, g, w)
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d records, were %d", len(got), len(want))
	}
	return ""
}

// changed returns how st differs from was, "" for not at all.
func changed(st *State, was []seen) (d string) {
	defer func() {
		if p := recover(); p != nil {
			d = fmt.Sprint("reading it panics: ", p)
		}
	}()
	return diffSeen(look(st), was)
}

// rowGen makes random rows that a state takes: every kind that produces
// records, with every cause, acks, releases and gaps of four billion oplog
// rows (sources too far for an offset).
type rowGen struct {
	rng  *rand.Rand
	conn uint64
}

// next returns a row st takes at index st.Applied, or nil for a gap it
// made in st.Applied itself.
func (g *rowGen) next(st *State) *oplog.Row {
	var live, bound []oplog.ParticipantID
	for i, m := range st.Members {
		if !m.Retired {
			live = append(live, oplog.ParticipantID(i))
			if m.Bound {
				bound = append(bound, oplog.ParticipantID(i))
			}
		}
	}
	newConn := func() oplog.ConnID { g.conn++; return oplog.ConnID{Server: 1, Ordinal: g.conn} }
	seq := func(r *oplog.Row, n int) *oplog.Row { r.Seq = st.LastSeq + oplog.Seq(n); return r }
	for {
		switch x := g.rng.IntN(100); {
		case len(live) < 3 || x < 3 && len(live) < 8:
			return seq(&oplog.Row{Kind: oplog.KindEnroll, Participant: oplog.ParticipantID(len(st.Members)), Generation: 1, Conn: newConn()}, 1)
		case x < 5:
			p := live[g.rng.IntN(len(live))]
			cause := []oplog.Cause{oplog.CauseNone, oplog.CauseEvicted}[g.rng.IntN(2)]
			return seq(&oplog.Row{Kind: oplog.KindLeave, Participant: p, Generation: st.Members[p].Generation, Cause: cause}, 1)
		case x < 10:
			p := live[g.rng.IntN(len(live))]
			m := &st.Members[p]
			n := 1
			if m.Bound {
				n = 2
			}
			return seq(&oplog.Row{Kind: oplog.KindAttach, Participant: p, Generation: m.Generation + 1, Conn: newConn(), Cursor: m.Cursor}, n)
		case x < 14 && len(bound) > 0:
			p := bound[g.rng.IntN(len(bound))]
			return seq(&oplog.Row{Kind: oplog.KindDetach, Participant: p, Generation: st.Members[p].Generation}, 1)
		case x < 18 && len(bound) > 0:
			p := bound[g.rng.IntN(len(bound))]
			m := &st.Members[p]
			cause := oplog.Cause(1 + g.rng.IntN(int(oplog.CauseUncleanRestart)))
			if cause == oplog.CauseSuperseded {
				cause = oplog.CauseClean
			}
			return seq(&oplog.Row{Kind: oplog.KindEnd, Participant: p, Generation: m.Generation, Conn: m.Conn, Cause: cause}, 1)
		case x < 40:
			p := live[g.rng.IntN(len(live))]
			var to []oplog.Seq
			for _, r := range st.Records.All() {
				if r.Seq > st.Members[p].Cursor && r.Addressed(p) {
					to = append(to, r.Seq)
				}
			}
			if len(to) > 0 {
				// Often through the last, so that every record is
				// reclaimed now and then.
				through := to[len(to)-1]
				if g.rng.IntN(2) == 0 {
					through = to[g.rng.IntN(len(to))]
				}
				return &oplog.Row{Kind: oplog.KindAck, Participant: p, Generation: st.Members[p].Generation, Through: through}
			}
		case x < 42 && st.Records.Len() > 0:
			through := st.Records.First() + oplog.Seq(g.rng.IntN(st.Records.Len()))
			return &oplog.Row{Kind: oplog.KindRelease, Through: through}
		case x < 43:
			st.Applied += 1<<32 + uint64(g.rng.IntN(3))
			return nil
		case len(bound) > 0:
			p := bound[g.rng.IntN(len(bound))]
			var payload []byte
			switch g.rng.IntN(3) {
			case 0:
			case 1:
				payload = []byte{}
			default:
				payload = make([]byte, 1+g.rng.IntN(64))
			}
			return seq(&oplog.Row{Kind: oplog.KindTell, Participant: p, Generation: st.Members[p].Generation, Payload: payload}, 1)
		}
	}
}

// step applies the next random row to st; it fails t if st refuses it.
func (g *rowGen) step(t *testing.T, st *State) {
	t.Helper()
	r := g.next(st)
	if r == nil {
		return
	}
	rows, err := Project(st, st.Applied, r)
	if err != nil {
		t.Fatalf("Project(%+v): %v", r, err)
	}
	Apply(st, st.Applied, r, rows)
}

// catchUp has every live member acknowledge the last record addressed to
// it, so that st retains nothing: what is left is its last run.
func (g *rowGen) catchUp(t *testing.T, st *State) {
	t.Helper()
	for i := range st.Members {
		p := oplog.ParticipantID(i)
		m := &st.Members[i]
		last := oplog.Seq(0)
		for _, r := range st.Records.All() {
			if r.Seq > m.Cursor && r.Addressed(p) {
				last = r.Seq
			}
		}
		if !m.Retired && last > 0 {
			r := &oplog.Row{Kind: oplog.KindAck, Participant: p, Generation: m.Generation, Through: last}
			rows, err := Project(st, st.Applied, r)
			if err != nil {
				t.Fatalf("Project(%+v): %v", r, err)
			}
			Apply(st, st.Applied, r, rows)
		}
	}
	if n := st.Records.Len(); n != 0 {
		t.Fatalf("%d records retained after every member caught up", n)
	}
}

// TestRetention_APublishedStateSeesNoChangeWhileACloneAdvances plays the
// participant service's turns: a reader holds the published state while
// the turn holder advances a clone of it, which shares its arrays, through
// tells, acks, releases, every record kind and cause, reclaiming that
// empties the retention and leaves its last run behind, compaction and
// sources four billion rows apart; then the clone is published and,
// owning every state now, the turn holder evicts. Whatever the clone
// does, the published state must read as it did when it was published.
// A reader goroutine reads it meanwhile, so that the race detector sees a
// write into what it reads.
func TestRetention_APublishedStateSeesNoChangeWhileACloneAdvances(t *testing.T) {
	turns := 600
	if testing.Short() {
		turns = 250
	}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { publishedUnchanged(t, seed, turns) })
	}
}

// publishedUnchanged is one seed's run of
// TestRetention_APublishedStateSeesNoChangeWhileACloneAdvances.
func publishedUnchanged(t *testing.T, seed uint64, turns int) {
	g := &rowGen{rng: rand.New(rand.NewPCG(seed, 7))}
	var mu sync.RWMutex
	pub := &State{}
	Apply(pub, 0, &oplog.Row{Kind: oplog.KindGenesis}, nil)
	was := look(pub)
	done := make(chan struct{})
	bad := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			mu.RLock()
			d := changed(pub, was)
			mu.RUnlock()
			if d != "" {
				bad <- d
				return
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
		select {
		case d := <-bad:
			t.Errorf("the reader saw the published state change: %s", d)
		default:
		}
	}()
	for turn := range turns {
		c := pub.Clone()
		for range 1 + g.rng.IntN(12) {
			if g.rng.IntN(16) == 0 {
				g.catchUp(t, c)
			} else {
				g.step(t, c)
			}
			if d := changed(pub, was); d != "" {
				t.Fatalf("turn %d: while a clone advanced, the published state changed: %s", turn, d)
			}
		}
		mu.Lock()
		pub = c
		if g.rng.IntN(4) == 0 {
			pub.Evict(int64(g.rng.IntN(200)))
		}
		was = look(pub)
		mu.Unlock()
	}
}

// TestRetention_ClearBelowLeavesTheStateItWasCopiedFrom plays a
// rebuilder's replay (package participant, rebuild.go): a copy of the
// retention taken before each row, cleared below the first record the
// state keeps once the row is applied, shares its arrays with the state
// when the row neither grew nor compacted them. The state must read as it
// did right after the row, and the copy must hold nothing below that
// record.
func TestRetention_ClearBelowLeavesTheStateItWasCopiedFrom(t *testing.T) {
	steps := 3000
	if testing.Short() {
		steps = 1200
	}
	for seed := range uint64(4) {
		g := &rowGen{rng: rand.New(rand.NewPCG(seed, 11))}
		st := &State{}
		Apply(st, 0, &oplog.Row{Kind: oplog.KindGenesis}, nil)
		for step := range steps {
			before := st.Records
			if g.rng.IntN(24) == 0 {
				g.catchUp(t, st)
			} else {
				g.step(t, st)
			}
			kept := st.LastSeq + 1
			if st.Records.Len() > 0 {
				kept = st.Records.First()
			}
			was := look(st)
			before.ClearBelow(kept)
			if d := diffSeen(look(st), was); d != "" {
				t.Fatalf("seed %d step %d: ClearBelow(%v) of the copy taken before the row changed the state: %s", seed, step, kept, d)
			}
			for i, s := range before.slots {
				if q := before.first + oplog.Seq(before.coldLen+i); q < kept && s != (slot{}) {
					t.Fatalf("seed %d step %d: ClearBelow(%v) left record %v's slot %+v", seed, step, kept, q, s)
				}
			}
		}
	}
}

// load returns the state a start or a derivation loads from a checkpoint
// of st (checkpoint.State, then participant's loadRetained and
// loadPayloads): st's positions and members, and its records retained
// one by one (Retain), each `record`'s payload held again.
func load(st *State) *State {
	out := &State{Applied: st.Applied, Produced: st.Produced, Nonce: st.Nonce, LastSeq: st.LastSeq,
		Members: slices.Clone(st.Members), InviteUses: st.InviteUses}
	for _, r := range st.Records.All() {
		rec := r.Record()
		rec.Recipients = slices.Clone(rec.Recipients) // decoded from a row: a list of its own
		out.Retain(rec, r.Source)
	}
	for i, r := range st.Records.All() {
		if r.Kind == KindRecord {
			p := r.Payload()
			if r.Evicted {
				p = make([]byte, r.PayloadLen())
			}
			out.Records.HoldPayload(i, p)
			out.PayloadBytes += int64(len(p))
		}
	}
	return out
}

// TestRetain_ALoadedStateGoesOnAsTheLiveOne checks that a state whose
// records were retained one by one from a checkpoint (runs split and
// joined as Retain finds them, lists of their own rather than interned)
// answers as the live state it was taken from, and keeps answering the
// same as both take the same rows: each record's fields, Next and Record
// for every member, the members' cursors and Released, the payload bytes.
func TestRetain_ALoadedStateGoesOnAsTheLiveOne(t *testing.T) {
	steps := 2000
	if testing.Short() {
		steps = 800
	}
	meta := func(v []seen) []seen {
		out := slices.Clone(v)
		for i := range out {
			out[i].payload, out[i].size, out[i].evicted = nil, 0, false
		}
		return out
	}
	same := func(where string, live, loaded *State) {
		t.Helper()
		if d := diffSeen(meta(look(loaded)), meta(look(live))); d != "" {
			t.Fatalf("%s: the loaded state's %s", where, d)
		}
		if !slices.Equal(loaded.Members, live.Members) || loaded.LastSeq != live.LastSeq {
			t.Fatalf("%s: the loaded state's members %+v, last seq %v; the live state's %+v, %v", where, loaded.Members, loaded.LastSeq, live.Members, live.LastSeq)
		}
		if loaded.PayloadBytes+loaded.EvictedBytes != live.PayloadBytes+live.EvictedBytes {
			t.Fatalf("%s: the loaded state holds %d+%d payload bytes, the live one %d+%d", where, loaded.PayloadBytes, loaded.EvictedBytes, live.PayloadBytes, live.EvictedBytes)
		}
		first := live.Records.First()
		for i := range live.Members {
			p := oplog.ParticipantID(i)
			for _, after := range []oplog.Seq{0, live.Members[i].Cursor, max(first, 1) - 1, first, first + 1, live.LastSeq} {
				a, aok := live.Next(p, after)
				b, bok := loaded.Next(p, after)
				if aok != bok || a.Seq != b.Seq {
					t.Fatalf("%s: Next(%v, %v) = %v %v loaded, %v %v live", where, p, after, b.Seq, bok, a.Seq, aok)
				}
			}
		}
		for q := max(first, 1) - 1; q <= live.LastSeq+1; q++ {
			a, aok := live.Record(q)
			b, bok := loaded.Record(q)
			if aok != bok || a.Seq != b.Seq || a.Kind != b.Kind || a.Cause != b.Cause || a.Participant != b.Participant {
				t.Fatalf("%s: Record(%v) = %+v %v loaded, %+v %v live", where, q, b, bok, a, aok)
			}
		}
	}
	for seed := range uint64(4) {
		g := &rowGen{rng: rand.New(rand.NewPCG(seed, 13))}
		live := &State{}
		Apply(live, 0, &oplog.Row{Kind: oplog.KindGenesis}, nil)
		var loaded *State
		for step := range steps {
			if step%100 == 0 {
				loaded = load(live)
				same(fmt.Sprintf("seed %d step %d, loaded", seed, step), live, loaded)
			}
			r := g.next(live)
			if r == nil {
				loaded.Applied = live.Applied
				continue
			}
			rows, err := Project(live, live.Applied, r)
			if err != nil {
				t.Fatalf("seed %d step %d: Project(%+v): %v", seed, step, r, err)
			}
			again, err := Project(loaded, loaded.Applied, r)
			if err != nil || !slices.EqualFunc(again, rows, func(a, b Row) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
				t.Fatalf("seed %d step %d: the loaded state projects %+v, %v; the live one %+v", seed, step, again, err, rows)
			}
			Apply(live, live.Applied, r, rows)
			Apply(loaded, loaded.Applied, r, again)
			same(fmt.Sprintf("seed %d step %d", seed, step), live, loaded)
		}
	}
}

// TestRetention_TheRunLeftBehindAndTheRunBeforeFirst walks the run
// boundaries one record at a time: a retention emptied by reclaiming,
// which keeps only its last run, a record that joins that run (which so
// begins before the first record retained), a record that starts a run,
// an ack and a release that end inside a run, and an eviction that
// resumes inside one. Each answer is the one a walk over the records
// gives, and a clone published before each step reads as it did.
func TestRetention_TheRunLeftBehindAndTheRunBeforeFirst(t *testing.T) {
	a := newApplier(t, 3)
	pub := a.st.Clone()
	was := look(pub)
	publish := func(where string) {
		t.Helper()
		if d := diffSeen(look(pub), was); d != "" {
			t.Fatalf("%s: the published state changed: %s", where, d)
		}
		pub = a.st.Clone()
		was = look(pub)
	}
	next := func(where string, p oplog.ParticipantID, after, want oplog.Seq) {
		t.Helper()
		got, ok := a.st.Next(p, after)
		if ok != (want != 0) || got.Seq != want {
			t.Errorf("%s: Next(%v, %v) = %v %v, want %v", where, p, after, got.Seq, ok, want)
		}
	}
	for range 3 {
		a.tell(0, []byte("abc"))
	}
	publish("three tells")
	a.ack(1, a.st.LastSeq)
	a.ack(2, a.st.LastSeq)
	last := a.st.LastSeq
	if a.st.Records.Len() != 0 || a.st.Records.First() != 0 || len(a.st.Records.runs) != 1 || a.st.PayloadBytes != 0 {
		t.Fatalf("caught up: %d records from %v in %d runs, %d bytes; want none, the last run kept", a.st.Records.Len(), a.st.Records.First(), len(a.st.Records.runs), a.st.PayloadBytes)
	}
	for p := range oplog.ParticipantID(3) {
		next("empty", p, 0, 0)
	}
	if _, ok := a.st.Record(last); ok {
		t.Errorf("empty: Record(%v) is retained", last)
	}
	if n := a.st.Evict(1 << 20); n != 0 {
		t.Errorf("empty: Evict freed %d", n)
	}
	if _, err := Project(&a.st, a.st.Applied, &oplog.Row{Kind: oplog.KindRelease, Through: last}); err == nil {
		t.Errorf("empty: a release through %v projects", last)
	}
	publish("caught up")

	// The next tells of the same sender join the run left behind.
	q1 := a.tell(0, []byte("defg"))
	q2 := a.tell(0, []byte("hi"))
	if len(a.st.Records.runs) != 1 || a.st.Records.runs[0].seq >= q1 || a.st.Records.First() != q1 {
		t.Fatalf("tells after the catch-up: %d runs, the first from %v, records from %v; want one run from before %v", len(a.st.Records.runs), a.st.Records.runs[0].seq, a.st.Records.First(), q1)
	}
	publish("two tells joining the run left behind")
	q3 := a.tell(1, []byte("jklmn"))
	if len(a.st.Records.runs) != 2 {
		t.Fatalf("a tell of another sender makes %d runs, want 2", len(a.st.Records.runs))
	}
	next("joined", 1, 0, q1)
	next("joined", 1, q1, q2)
	next("joined", 1, q2, 0)
	next("joined", 0, 0, q3)
	next("joined", 2, q2, q3)
	for i, r := range a.st.Records.All() {
		if want := q1 + oplog.Seq(i); r.Seq != want || r.Participant != oplog.ParticipantID(min(i/2, 1)) {
			t.Errorf("record %d is %v of %v, want %v of p%d", i, r.Seq, r.Participant, want, min(i/2, 1))
		}
	}
	publish("a tell of another sender")

	// Evict stops inside the run that began before the first record,
	// then resumes there. It writes in place: the published state is the
	// one it evicts from (package participant, under the write lock).
	if n := a.st.Evict(1); n != 4 {
		t.Errorf("Evict(1) = %d, want record %v's 4 bytes", n, q1)
	}
	if n := a.st.Evict(1); n != 2 {
		t.Errorf("the second Evict(1) = %d, want record %v's 2 bytes", n, q2)
	}
	pub = a.st.Clone()
	was = look(pub)

	// An ack inside the first run reclaims up to it; a release ends
	// inside the next.
	a.ack(1, q1)
	a.ack(2, q1)
	if a.st.Records.First() != q2 || a.st.Records.Len() != 2 || a.st.EvictedBytes != 2 || a.st.PayloadBytes != 5 {
		t.Fatalf("after the acks through %v: records from %v, %d of them, %d bytes evicted, %d held; want from %v, 2, 2, 5",
			q1, a.st.Records.First(), a.st.Records.Len(), a.st.EvictedBytes, a.st.PayloadBytes, q2)
	}
	publish("acked inside the first run")
	q4 := a.tell(1, []byte("op"))
	release := &oplog.Row{Kind: oplog.KindRelease, Through: q3}
	rows, err := Project(&a.st, a.st.Applied, release)
	if err != nil {
		t.Fatalf("Project(release through %v): %v", q3, err)
	}
	Apply(&a.st, a.st.Applied, release, rows)
	if a.st.Records.First() != q4 || a.st.Records.Len() != 1 {
		t.Fatalf("after the release through %v: records from %v, %d of them; want %v alone", q3, a.st.Records.First(), a.st.Records.Len(), q4)
	}
	for p, want := range []oplog.Seq{q3, q2, q3} {
		if got := a.st.Members[p].Released; got != want {
			t.Errorf("member %d Released %v, want %v", p, got, want)
		}
	}
	next("released", 0, 0, q4)
	next("released", 1, 0, 0)
	next("released", 2, q3, q4)
	publish("released")
}
