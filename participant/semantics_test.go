package participant

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// The semantics tests drive the service through its API, one docs/PROTOCOL.md
// rule at a time: the order of checks, the records each operation appends,
// recipients, deliveries, wakes, replays, and credentials across a restart.

// semKey is the node key of these tests, independent of other test files.
var semKey = bytes.Repeat([]byte{0x5e}, NodeKeySize)

// semClock is a settable clock for Options.Now, in whole milliseconds as
// the rows record time.
type semClock struct{ ms atomic.Int64 }

func newSemClock() *semClock {
	c := &semClock{}
	c.ms.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli())
	return c
}

func (c *semClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *semClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// semEnv is one service over a memory store wrapped in a faultstore.
type semEnv struct {
	t     *testing.T
	ctx   context.Context
	mem   *store.Memory
	fs    *faultstore.Store
	svc   *Service
	opts  Options
	clock *semClock
	next  uint64
}

func newSemEnv(t *testing.T, opts Options) *semEnv {
	t.Helper()
	e := &semEnv{t: t, ctx: context.Background(), mem: store.NewMemory(), clock: newSemClock()}
	opts.NodeKey = semKey
	opts.Now = e.clock.Now
	e.opts = opts
	e.open()
	return e
}

func (e *semEnv) open() {
	e.t.Helper()
	e.fs = faultstore.New(e.mem)
	svc, err := Open(e.ctx, e.fs, e.opts)
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	e.svc = svc
}

// restart crashes the store and opens a new service on what survived.
func (e *semEnv) restart() {
	e.t.Helper()
	e.svc.Close()
	e.mem.Crash()
	e.open()
}

// tok returns a token never used before in this env.
func (e *semEnv) tok() Token {
	e.next++
	var t Token
	t[0] = 0xa5
	for i := 0; i < 8; i++ {
		t[8+i] = byte(e.next >> (8 * i))
	}
	return t
}

// semConn is a connection that counts its wakes.
type semConn struct {
	*Conn
	wakes *atomic.Int64
}

func (e *semEnv) conn() semConn {
	n := new(atomic.Int64)
	return semConn{Conn: e.svc.Connect(func() { n.Add(1) }), wakes: n}
}

func (e *semEnv) enroll(c semConn, conv ConversationID) Bound {
	e.t.Helper()
	b, err := c.Enroll(e.ctx, Enroll{Conversation: conv, Token: e.tok()})
	if err != nil {
		e.t.Fatalf("Enroll(conv=%v) = %v", conv, err)
	}
	return b
}

func (e *semEnv) attach(c semConn, b Bound) Bound {
	e.t.Helper()
	nb, err := c.Attach(e.ctx, Attach{Conversation: b.Conversation, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: e.tok()})
	if err != nil {
		e.t.Fatalf("Attach(%v %v) = %v", b.Participant, b.Generation, err)
	}
	return nb
}

func (e *semEnv) tell(c semConn, b Bound, payload string) Told {
	e.t.Helper()
	told, err := c.Tell(e.ctx, Tell{Conversation: b.Conversation, Participant: b.Participant, Generation: b.Generation, Token: e.tok(), Payload: []byte(payload)})
	if err != nil {
		e.t.Fatalf("Tell(%v %q) = %v", b.Participant, payload, err)
	}
	return told
}

func (e *semEnv) detach(c semConn, b Bound) Ended {
	e.t.Helper()
	d, err := c.Detach(e.ctx, Detach{Conversation: b.Conversation, Participant: b.Participant, Generation: b.Generation, Token: e.tok()})
	if err != nil {
		e.t.Fatalf("Detach(%v) = %v", b.Participant, err)
	}
	return d
}

func (e *semEnv) leave(c semConn, b Bound) Ended {
	e.t.Helper()
	l, err := c.Leave(e.ctx, Leave{Conversation: b.Conversation, Participant: b.Participant, Generation: b.Generation, Secret: b.Secret, Token: e.tok()})
	if err != nil {
		e.t.Fatalf("Leave(%v) = %v", b.Participant, err)
	}
	return l
}

func (e *semEnv) ack(c semConn, b Bound, through Seq) Acked {
	e.t.Helper()
	a, err := c.Ack(e.ctx, Ack{Conversation: b.Conversation, Participant: b.Participant, Generation: b.Generation, Through: through})
	if err != nil {
		e.t.Fatalf("Ack(%v through %v) = %v", b.Participant, through, err)
	}
	return a
}

// semDrain returns every delivery Next offers c in conv after start.
func semDrain(c semConn, conv ConversationID, start Offered) []Delivery {
	c.SetOfferedForTest(conv, start)
	var out []Delivery
	for len(out) < 10000 {
		d, ok := c.Next(conv)
		if !ok {
			break
		}
		out = append(out, d)
	}
	return out
}

// nextAfter is Next after the chosen point o.
func nextAfter(c semConn, conv ConversationID, o Offered) (Delivery, bool) {
	c.SetOfferedForTest(conv, o)
	return c.Next(conv)
}

// semShow renders deliveries compactly: "seq kind subject[/cause][=payload]".
func semShow(ds []Delivery) string {
	parts := make([]string, 0, len(ds))
	for _, d := range ds {
		s := fmt.Sprintf("%d %v %v", d.Seq, d.Kind, d.Participant)
		if d.Cause != oplog.CauseNone {
			s += "/" + d.Cause.String()
		}
		if d.Kind == outbox.KindRecord {
			s += "=" + string(d.Payload)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// semWant describes an expected *Error: the code and the extras the
// protocol lists for it.
type semWant struct {
	code        Code
	gen         Generation // stale_authority with the extra, receipt_expired
	hasGen      bool
	cursor      Seq
	limit       uint64
	participant ParticipantID
	reason      string
}

func semCheckErr(t *testing.T, what string, err error, w semWant) {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) {
		t.Errorf("%s = %v, want error %s", what, err, w.code)
		return
	}
	got := semWant{code: pe.Code, gen: pe.Generation, hasGen: pe.HasGeneration, cursor: pe.Cursor, limit: pe.Limit, participant: pe.Participant, reason: pe.Reason}
	if !pe.HasGeneration {
		got.gen = 0
	}
	if got != w {
		t.Errorf("%s = %+v (%v), want %+v", what, got, err, w)
	}
}

// semWorld is the fixture of the refusal table, in conversation 1:
//
//	a  p0 on c1, attached once on c1: generation 2 (aOld is its g1 credential)
//	b  p1 on c2
//	r  p2 enrolled on c3, told "r", left
//	d  p3 enrolled on c4, detached
//	c5 holds nothing; conversation 9 does not exist
type semWorld struct {
	e                  *semEnv
	c1, c2, c3, c4, c5 semConn
	aOld, a, b, r, d   Bound
	aTell              Tell // committed at g1 by a
	aTold              Told
	rTell              Tell
	rTold              Told
	rEnroll            Enroll
	rLeave             Leave
	rLeft              Ended
}

func newSemWorld(t *testing.T) *semWorld {
	e := newSemEnv(t, Options{MaxRecordBytes: 16})
	w := &semWorld{e: e, c1: e.conn(), c2: e.conn(), c3: e.conn(), c4: e.conn(), c5: e.conn()}
	w.aOld = e.enroll(w.c1, 1)
	w.aTell = Tell{Conversation: 1, Participant: w.aOld.Participant, Generation: 1, Token: e.tok(), Payload: []byte("hi")}
	var err error
	if w.aTold, err = w.c1.Tell(e.ctx, w.aTell); err != nil {
		t.Fatal(err)
	}
	w.a = e.attach(w.c1, w.aOld)
	w.b = e.enroll(w.c2, 1)
	w.rEnroll = Enroll{Conversation: 1, Token: e.tok()}
	if w.r, err = w.c3.Enroll(e.ctx, w.rEnroll); err != nil {
		t.Fatal(err)
	}
	w.rTell = Tell{Conversation: 1, Participant: w.r.Participant, Generation: 1, Token: e.tok(), Payload: []byte("r")}
	if w.rTold, err = w.c3.Tell(e.ctx, w.rTell); err != nil {
		t.Fatal(err)
	}
	w.rLeave = Leave{Conversation: 1, Participant: w.r.Participant, Generation: 1, Secret: w.r.Secret, Token: e.tok()}
	if w.rLeft, err = w.c3.Leave(e.ctx, w.rLeave); err != nil {
		t.Fatal(err)
	}
	w.d = e.enroll(w.c4, 1)
	e.detach(w.c4, w.d)
	if w.a.Participant != 0 || w.b.Participant != 1 || w.r.Participant != 2 || w.d.Participant != 3 || w.a.Generation != 2 {
		t.Fatalf("fixture: a=%v/%v b=%v r=%v d=%v", w.a.Participant, w.a.Generation, w.b.Participant, w.r.Participant, w.d.Participant)
	}
	return w
}

var semBadSecret = Secret{1, 2, 3}

func TestSemantics_OrderOfChecks(t *testing.T) {
	tests := []struct {
		name string
		do   func(w *semWorld) error
		want semWant
	}{
		// 1. the token wins over everything.
		{"tell token of another payload conflicts, whatever the authority", func(w *semWorld) error {
			r := w.aTell
			r.Payload = []byte("ho")
			_, err := w.c5.Tell(w.e.ctx, r)
			return err
		}, semWant{code: CodeTokenConflict}},
		{"tell token reused for a detach conflicts", func(w *semWorld) error {
			_, err := w.c1.Detach(w.e.ctx, Detach{Conversation: 1, Participant: 0, Generation: 2, Token: w.aTell.Token})
			return err
		}, semWant{code: CodeTokenConflict}},
		{"retired participant's tell token with another payload conflicts", func(w *semWorld) error {
			r := w.rTell
			r.Payload = []byte("x")
			_, err := w.c1.Tell(w.e.ctx, r)
			return err
		}, semWant{code: CodeTokenConflict}},
		// 2. unknown_participant.
		{"tell in a conversation that does not exist", func(w *semWorld) error {
			_, err := w.c1.Tell(w.e.ctx, Tell{Conversation: 9, Participant: 0, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"attach in a conversation that does not exist", func(w *semWorld) error {
			_, err := w.c1.Attach(w.e.ctx, Attach{Conversation: 9, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"ack in a conversation that does not exist", func(w *semWorld) error {
			_, err := w.c1.Ack(w.e.ctx, Ack{Conversation: 9, Participant: 0, Generation: 1, Through: 1})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"detach in a conversation that does not exist", func(w *semWorld) error {
			_, err := w.c1.Detach(w.e.ctx, Detach{Conversation: 9, Participant: 0, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"leave in a conversation that does not exist", func(w *semWorld) error {
			_, err := w.c1.Leave(w.e.ctx, Leave{Conversation: 9, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"tell of a participant never minted", func(w *semWorld) error {
			_, err := w.c1.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 4, Generation: 1, Token: w.aTell.Token, Payload: []byte("hi")})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"attach of a participant never minted", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 7, Generation: 1, Secret: semBadSecret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"ack of a participant never minted", func(w *semWorld) error {
			_, err := w.c1.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 4, Generation: 1, Through: 1})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		{"leave of a participant never minted", func(w *semWorld) error {
			_, err := w.c1.Leave(w.e.ctx, Leave{Conversation: 1, Participant: 4, Generation: 1, Secret: semBadSecret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeUnknownParticipant}},
		// 3. retired, before stale_authority.
		{"attach of a retired participant with its secret", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 2, Generation: 1, Secret: w.r.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeRetired}},
		{"attach of a retired participant with a wrong secret", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 2, Generation: 5, Secret: semBadSecret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeRetired}},
		{"tell of a retired participant", func(w *semWorld) error {
			_, err := w.c3.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 2, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeRetired}},
		{"ack of a retired participant", func(w *semWorld) error {
			_, err := w.c3.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 2, Generation: 1, Through: 0})
			return err
		}, semWant{code: CodeRetired}},
		{"detach of a retired participant", func(w *semWorld) error {
			_, err := w.c3.Detach(w.e.ctx, Detach{Conversation: 1, Participant: 2, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeRetired}},
		{"leave of a retired participant with a new token", func(w *semWorld) error {
			l := w.rLeave
			l.Token = w.e.tok()
			_, err := w.c3.Leave(w.e.ctx, l)
			return err
		}, semWant{code: CodeRetired}},
		// 4. stale_authority, with the extra only when the secret verifies.
		{"attach with the previous generation and its right secret", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority, gen: 2, hasGen: true}},
		{"attach with the current generation and a wrong secret", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 2, Secret: semBadSecret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"attach with the current generation and the previous secret", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 2, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"attach with an old generation and a wrong secret", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 1, Secret: semBadSecret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"attach with a future generation", func(w *semWorld) error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 3, Secret: w.a.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"stale attach before binding_occupied", func(w *semWorld) error {
			_, err := w.c2.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority, gen: 2, hasGen: true}},
		{"leave with the previous generation and its right secret", func(w *semWorld) error {
			_, err := w.c1.Leave(w.e.ctx, Leave{Conversation: 1, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority, gen: 2, hasGen: true}},
		{"leave with the current generation and a wrong secret", func(w *semWorld) error {
			_, err := w.c1.Leave(w.e.ctx, Leave{Conversation: 1, Participant: 0, Generation: 2, Secret: semBadSecret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"stale leave from another connection: stale before no_binding", func(w *semWorld) error {
			_, err := w.c2.Leave(w.e.ctx, Leave{Conversation: 1, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority, gen: 2, hasGen: true}},
		{"tell with the previous generation on the binding's connection", func(w *semWorld) error {
			_, err := w.c1.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"stale tell from another connection: stale before no_binding", func(w *semWorld) error {
			_, err := w.c5.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"stale oversized tell: stale before too_large", func(w *semWorld) error {
			_, err := w.c1.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 1, Token: w.e.tok(), Payload: make([]byte, 100)})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"ack with the previous generation", func(w *semWorld) error {
			_, err := w.c1.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 0, Generation: 1, Through: 0})
			return err
		}, semWant{code: CodeStaleAuthority}},
		{"detach with the previous generation", func(w *semWorld) error {
			_, err := w.c1.Detach(w.e.ctx, Detach{Conversation: 1, Participant: 0, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeStaleAuthority}},
		// 5. no_binding.
		{"tell from another connection", func(w *semWorld) error {
			_, err := w.c2.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 2, Token: w.e.tok()})
			return err
		}, semWant{code: CodeNoBinding}},
		{"oversized tell from another connection: no_binding before too_large", func(w *semWorld) error {
			_, err := w.c2.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 2, Token: w.e.tok(), Payload: make([]byte, 100)})
			return err
		}, semWant{code: CodeNoBinding}},
		{"ack from another connection", func(w *semWorld) error {
			_, err := w.c5.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 0, Generation: 2, Through: 0})
			return err
		}, semWant{code: CodeNoBinding}},
		{"detach from another connection", func(w *semWorld) error {
			_, err := w.c2.Detach(w.e.ctx, Detach{Conversation: 1, Participant: 0, Generation: 2, Token: w.e.tok()})
			return err
		}, semWant{code: CodeNoBinding}},
		{"leave from another connection while bound", func(w *semWorld) error {
			_, err := w.c2.Leave(w.e.ctx, Leave{Conversation: 1, Participant: 0, Generation: 2, Secret: w.a.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeNoBinding}},
		{"tell of a detached participant on its old connection", func(w *semWorld) error {
			_, err := w.c4.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 3, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeNoBinding}},
		{"ack of a detached participant", func(w *semWorld) error {
			_, err := w.c4.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 3, Generation: 1, Through: 0})
			return err
		}, semWant{code: CodeNoBinding}},
		{"detach of a detached participant", func(w *semWorld) error {
			_, err := w.c4.Detach(w.e.ctx, Detach{Conversation: 1, Participant: 3, Generation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeNoBinding}},
		// 6. binding_occupied.
		{"enroll twice on one connection in one conversation", func(w *semWorld) error {
			_, err := w.c1.Enroll(w.e.ctx, Enroll{Conversation: 1, Token: w.e.tok()})
			return err
		}, semWant{code: CodeBindingOccupied}},
		{"attach of a bound participant on a connection holding another's binding", func(w *semWorld) error {
			_, err := w.c1.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 1, Generation: 1, Secret: w.b.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeBindingOccupied}},
		{"attach of a detached participant on a connection holding another's binding", func(w *semWorld) error {
			_, err := w.c2.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 3, Generation: 1, Secret: w.d.Secret, Token: w.e.tok()})
			return err
		}, semWant{code: CodeBindingOccupied}},
		// 7. operation checks.
		{"oversized tell", func(w *semWorld) error {
			_, err := w.c1.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 2, Token: w.e.tok(), Payload: make([]byte, 17)})
			return err
		}, semWant{code: CodeTooLarge, limit: 16}},
		{"ack below the cursor", func(w *semWorld) error {
			next, _ := nextAfter(w.c2, 1, Offered{})
			w.e.ack(w.c2, w.b, next.Seq)
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: next.Seq - 1})
			return err
		}, semWant{code: CodeAckRegression, cursor: 6}},
		{"ack of its own joined record", func(w *semWorld) error {
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: 5})
			return err
		}, semWant{code: CodeAckGap}},
		{"ack of a record committed before it enrolled", func(w *semWorld) error {
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: 2})
			return err
		}, semWant{code: CodeAckGap}},
		{"ack beyond the last record", func(w *semWorld) error {
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: 100})
			return err
		}, semWant{code: CodeAckGap}},
		{"ack of its own told record", func(w *semWorld) error {
			told := w.e.tell(w.c2, w.b, "mine")
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: told.Seq})
			return err
		}, semWant{code: CodeAckGap}},
		{"ack gap reports the cursor", func(w *semWorld) error {
			w.e.ack(w.c2, w.b, 7)
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: 100})
			return err
		}, semWant{code: CodeAckGap, cursor: 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newSemWorld(t)
			// Ops that succeed inside do run before the snapshot is taken
			// only where the case needs them; compare the durable counters
			// around the whole case minus those.
			err := tc.do(w)
			semCheckErr(t, tc.name, err, tc.want)
		})
	}
}

// TestSemantics_RefusalChangesNothing checks that refusals write nothing.
func TestSemantics_RefusalChangesNothing(t *testing.T) {
	w := newSemWorld(t)
	before := w.e.mem.Stats()
	refusals := []func() error{
		func() error {
			_, err := w.c5.Attach(w.e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 1, Secret: w.aOld.Secret, Token: w.e.tok()})
			return err
		},
		func() error {
			_, err := w.c2.Tell(w.e.ctx, Tell{Conversation: 1, Participant: 0, Generation: 2, Token: w.e.tok()})
			return err
		},
		func() error {
			_, err := w.c1.Enroll(w.e.ctx, Enroll{Conversation: 1, Token: w.e.tok()})
			return err
		},
		func() error {
			_, err := w.c2.Ack(w.e.ctx, Ack{Conversation: 1, Participant: 1, Generation: 1, Through: 100})
			return err
		},
		func() error {
			_, err := w.c3.Leave(w.e.ctx, Leave{Conversation: 1, Participant: 2, Generation: 1, Secret: w.r.Secret, Token: w.e.tok()})
			return err
		},
	}
	for i, f := range refusals {
		if err := f(); err == nil {
			t.Errorf("refusal %d succeeded", i)
		}
	}
	if after := w.e.mem.Stats(); after.Appends != before.Appends || after.CASWrites != before.CASWrites {
		t.Errorf("refusals wrote: stats %+v, before %+v", after, before)
	}
}

func TestSemantics_ReplaysWinOverAuthority(t *testing.T) {
	w := newSemWorld(t)
	ctx := w.e.ctx
	// A tell replayed after its generation moved on, from any connection.
	for _, c := range []semConn{w.c1, w.c5} {
		got, err := c.Tell(ctx, w.aTell)
		if want := (Told{Conversation: 1, Seq: w.aTold.Seq, Replay: ReplayCommitted}); err != nil || got != want {
			t.Errorf("Tell replay after attach = %+v, %v, want %+v", got, err, want)
		}
	}
	// A retired participant's tell, leave and enroll still replay.
	if got, err := w.c1.Tell(ctx, w.rTell); err != nil || got != (Told{Conversation: 1, Seq: w.rTold.Seq, Replay: ReplayCommitted}) {
		t.Errorf("retired Tell replay = %+v, %v, want seq %v committed", got, err, w.rTold.Seq)
	}
	wantLeft := w.rLeft
	wantLeft.Replay = ReplayCommitted
	if got, err := w.c5.Leave(ctx, w.rLeave); err != nil || got != wantLeft {
		t.Errorf("retired Leave replay = %+v, %v, want %+v", got, err, wantLeft)
	}
	wantR := w.r
	wantR.Replay = ReplayUnbound
	if got, err := w.c1.Enroll(ctx, w.rEnroll); err != nil || got != wantR {
		t.Errorf("retired Enroll replay = %+v, %v, want %+v", got, err, wantR)
	}
}

// TestSemantics_LeaveDetachedFromAnyConnection: a detached participant
// leaves from any connection, with its secret.
func TestSemantics_LeaveDetachedFromAnyConnection(t *testing.T) {
	w := newSemWorld(t)
	l := w.e.leave(w.c5, w.d)
	if l.Participant != 3 || l.Seq != 11 || l.Replay != ReplayNone {
		t.Errorf("Leave(detached p3 from c5) = %+v, want p3 seq 11", l)
	}
	// a (p0) receives the left record.
	ds := semDrain(w.c1, 1, Offered{})
	if len(ds) == 0 || ds[len(ds)-1].Seq != 11 || ds[len(ds)-1].Kind != outbox.KindLeft || ds[len(ds)-1].Participant != 3 {
		t.Errorf("deliveries to p0 = %s, want last 11 left p3", semShow(ds))
	}
}

func TestSemantics_Capacity(t *testing.T) {
	e := newSemEnv(t, Options{MaxParticipants: 2, MaxConversationsPerConn: 1})
	c1, c2, c3 := e.conn(), e.conn(), e.conn()
	a := e.enroll(c1, 1)
	e.enroll(c2, 1)
	_, err := c3.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok()})
	semCheckErr(t, "third Enroll with MaxParticipants 2", err, semWant{code: CodeCapacityExceeded, limit: 2})
	_, err = c1.Enroll(e.ctx, Enroll{Conversation: 1, Token: e.tok()})
	semCheckErr(t, "Enroll on a bound connection of a full conversation", err, semWant{code: CodeBindingOccupied})
	_, err = c1.Enroll(e.ctx, Enroll{Conversation: 2, Token: e.tok()})
	semCheckErr(t, "Enroll in a second conversation with MaxConversationsPerConn 1", err, semWant{code: CodeCapacityExceeded, limit: 1})
	e.enroll(c3, 2)
	e.detach(c1, a)
	b := e.enroll(c1, 3)
	_, err = c1.Attach(e.ctx, Attach{Conversation: 1, Participant: a.Participant, Generation: a.Generation, Secret: a.Secret, Token: e.tok()})
	semCheckErr(t, "Attach on a connection at MaxConversationsPerConn", err, semWant{code: CodeCapacityExceeded, limit: 1})
	// Attaching the participant a connection already holds adds nothing.
	if _, err := c1.Attach(e.ctx, Attach{Conversation: 3, Participant: b.Participant, Generation: 1, Secret: b.Secret, Token: e.tok()}); err != nil {
		t.Errorf("Attach of the binding the connection holds = %v", err)
	}
}

// TestSemantics_Records checks the records of every operation, their seqs
// and recipients, as a watcher sees them.
func TestSemantics_Records(t *testing.T) {
	e := newSemEnv(t, Options{})
	cw, c1, c2, c3 := e.conn(), e.conn(), e.conn(), e.conn()
	early := e.enroll(c1, 1) // p0: joined 1, to nobody
	w := e.enroll(cw, 1)     // p1: joined 2
	if early.Participant != 0 || w.Participant != 1 || early.Generation != 1 || w.Generation != 1 || early.Cursor != 0 {
		t.Fatalf("enroll ids/generations: %+v %+v", early, w)
	}
	told := e.tell(c1, early, "x") // 3 record p0
	if told.Seq != 3 {
		t.Errorf("Tell seq = %v, want 3", told.Seq)
	}
	a1 := e.attach(c2, early) // 4 detached p0/superseded, 5 attached p0
	if a1.Generation != 2 || a1.Secret == early.Secret {
		t.Errorf("Attach = generation %v (secret changed: %v), want 2 and a new secret", a1.Generation, a1.Secret != early.Secret)
	}
	d := e.detach(c2, a1) // 6 detached p0/clean
	if d.Seq != 6 || d.Participant != 0 {
		t.Errorf("Detach = %+v, want seq 6", d)
	}
	a2 := e.attach(c1, a1) // 7 attached p0 (nothing to supersede)
	p2 := e.enroll(c3, 1)  // 8 joined p2
	l := e.leave(c3, p2)   // 9 left p2
	if l.Seq != 9 {
		t.Errorf("Leave seq = %v, want 9", l.Seq)
	}
	e.tell(c1, a2, "y") // 10 record p0
	want := "3 record p0=x, 4 detached p0/superseded, 5 attached p0, 6 detached p0/clean, 7 attached p0, 8 joined p2, 9 left p2, 10 record p0=y"
	if got := semShow(semDrain(cw, 1, Offered{})); got != want {
		t.Errorf("watcher deliveries:\n got %s\nwant %s", got, want)
	}
	// p0 never gets its own records, and gets nothing from before it enrolled.
	if got, want := semShow(semDrain(c1, 1, Offered{})), "2 joined p1, 8 joined p2, 9 left p2"; got != want {
		t.Errorf("p0 deliveries: got %s, want %s", got, want)
	}
	// The left participant receives nothing more; new records skip it.
	e.tell(c1, a2, "z")
	st := e.svc.existing(1).loaded()
	if rec, ok := st.Record(11); !ok || rec.Addressed(2) || !rec.Addressed(1) {
		t.Errorf("record 11 recipients = %+v, want p1 and not the left p2", rec)
	}

	// Conn.End with each cause, and the restart.
	causes := []struct {
		cause Cause
		want  string
	}{
		{oplog.CauseClean, "detached p%d/clean"},
		{oplog.CauseShutdown, "detached p%d/shutdown"},
		{oplog.CauseConnectionLost, "died p%d/connection_lost"},
		{oplog.CauseProtocolError, "died p%d/protocol_error"},
	}
	seq := Seq(11)
	var lines []string
	for _, c := range causes {
		cc := e.conn()
		b := e.enroll(cc, 1)
		seq++
		lines = append(lines, fmt.Sprintf("%d joined p%d", seq, b.Participant))
		if err := cc.End(e.ctx, c.cause); err != nil {
			t.Fatalf("End(%v) = %v", c.cause, err)
		}
		seq++
		lines = append(lines, fmt.Sprintf("%d "+c.want, seq, b.Participant))
	}
	if got, want := semShow(semDrain(cw, 1, Offered{Epoch: Epoch{Conn: cw.ID(), Generation: 1}, Through: 11})), strings.Join(lines, ", "); got != want {
		t.Errorf("End records:\n got %s\nwant %s", got, want)
	}
	// End of a connection without bindings, and a second End, do nothing.
	for i := 0; i < 2; i++ {
		if err := c3.End(e.ctx, oplog.CauseClean); err != nil {
			t.Errorf("End of a connection without bindings = %v", err)
		}
	}
	if st := e.svc.existing(1).loaded(); st.LastSeq != 19 {
		t.Errorf("LastSeq after the Ends = %v, want 19", st.LastSeq)
	}

	e.restart()
	cr := e.conn()
	w2 := e.attach(cr, w)
	if w2.Generation != 2 || w2.Cursor != 0 {
		t.Errorf("Attach after restart = %+v, want generation 2, cursor 0", w2)
	}
	// p0 (on c1) and p1 (on cw) were bound: two unclean_restart endings,
	// then p1's attached.
	st = e.svc.existing(1).loaded()
	for _, want := range []struct {
		seq  Seq
		kind RecordKind
		p    ParticipantID
		c    Cause
	}{{20, outbox.KindDied, 0, oplog.CauseUncleanRestart}, {21, outbox.KindDied, 1, oplog.CauseUncleanRestart}, {22, outbox.KindAttached, 1, oplog.CauseNone}} {
		rec, ok := st.Record(want.seq)
		if !ok || rec.Kind != want.kind || rec.Participant != want.p || rec.Cause != want.c {
			t.Errorf("record %v after restart = %+v, want %v %v %v", want.seq, rec, want.kind, want.p, want.c)
		}
	}
	if st.LastSeq != 22 {
		t.Errorf("LastSeq after restart and attach = %v, want 22", st.LastSeq)
	}
	if ds := semDrain(cr, 1, Offered{}); len(ds) == 0 || ds[len(ds)-1].Seq != 20 {
		t.Errorf("p1's deliveries after restart = %s, want ending with 20 died p0", semShow(ds))
	}
}

// TestConn_Next_ContinuesAfterWhatItOffered: Conn owns the offered
// cursor; each Next continues after the last delivery it returned to the
// binding, and a new binding starts again at the durable cursor.
func TestConn_Next_ContinuesAfterWhatItOffered(t *testing.T) {
	e := newSemEnv(t, Options{})
	c1, c2, c3 := e.conn(), e.conn(), e.conn()
	w := e.enroll(c1, 1)
	s := e.enroll(c2, 1)
	e.tell(c2, s, "a") // seq 3
	e.tell(c2, s, "b") // seq 4
	var got []Seq
	for {
		d, ok := c1.Next(1)
		if !ok {
			break
		}
		got = append(got, d.Seq)
	}
	if want := []Seq{2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("Next until none = %v, want %v", got, want)
	}
	if d, ok := c1.Next(1); ok {
		t.Fatalf("Next after everything was offered = %v, want none", d.Seq)
	}
	st, _ := e.svc.Status(1)
	for _, p := range st.Participants {
		if p.Participant == w.Participant && p.Offered != 4 {
			t.Errorf("Status(1) of p%v: offered %v, want 4", p.Participant, p.Offered)
		}
	}
	e.tell(c2, s, "c") // seq 5
	if d, ok := c1.Next(1); !ok || d.Seq != 5 {
		t.Errorf("Next after a new record = %v %v, want 5", d.Seq, ok)
	}
	e.ack(c1, w, 3)
	e.attach(c3, w)
	if d, ok := c3.Next(1); !ok || d.Seq != 4 {
		t.Errorf("Next of a new binding acknowledged through 3 = %v %v, want 4", d.Seq, ok)
	}
}

// TestSemantics_Deliveries checks ascending order, Offered progress, and
// restarts from the durable cursor on a new binding.
func TestSemantics_Deliveries(t *testing.T) {
	e := newSemEnv(t, Options{})
	c1, c2, c3 := e.conn(), e.conn(), e.conn()
	w := e.enroll(c1, 1)
	s := e.enroll(c2, 1)
	for i := 0; i < 4; i++ {
		e.tell(c2, s, fmt.Sprint(i)) // seqs 3..6
	}
	all := semDrain(c1, 1, Offered{})
	if got, want := semShow(all), "2 joined p1, 3 record p1=0, 4 record p1=1, 5 record p1=2, 6 record p1=3"; got != want {
		t.Fatalf("deliveries = %s, want %s", got, want)
	}
	ep := all[0].Epoch
	if ep != (Epoch{Conn: c1.ID(), Generation: 1}) {
		t.Errorf("epoch = %+v", ep)
	}
	for _, d := range all {
		if d.Recipient != w.Participant || d.Conversation != 1 || d.Epoch != ep {
			t.Errorf("delivery %+v: wrong recipient, conversation or epoch", d)
		}
	}
	if d, ok := nextAfter(c1, 1, Offered{Epoch: ep, Through: 4}); !ok || d.Seq != 5 {
		t.Errorf("Next after offered 4 = %v %v, want 5", d.Seq, ok)
	}
	if _, ok := nextAfter(c1, 1, Offered{Epoch: ep, Through: 6}); ok {
		t.Errorf("Next after everything offered: ok")
	}
	// Another epoch's Offered means nothing.
	if d, ok := nextAfter(c1, 1, Offered{Epoch: Epoch{Conn: c2.ID(), Generation: 1}, Through: 4}); !ok || d.Seq != 2 {
		t.Errorf("Next with a foreign Offered = %v %v, want 2", d.Seq, ok)
	}
	e.ack(c1, w, 3)
	if d, ok := nextAfter(c1, 1, Offered{}); !ok || d.Seq != 4 {
		t.Errorf("Next after ack 3 = %v %v, want 4", d.Seq, ok)
	}
	if _, ok := nextAfter(c2, 1, Offered{}); ok {
		t.Errorf("the sender is offered something")
	}
	if _, ok := nextAfter(c3, 1, Offered{}); ok {
		t.Errorf("an unbound connection is offered something")
	}
	// A new binding restarts from the durable cursor, with repeats identical.
	w2 := e.attach(c3, w)
	if w2.Cursor != 3 {
		t.Errorf("attach cursor = %v, want 3", w2.Cursor)
	}
	if _, ok := nextAfter(c1, 1, Offered{Epoch: ep}); ok {
		t.Errorf("the superseded connection is still offered records")
	}
	again := semDrain(c3, 1, Offered{Epoch: ep, Through: 5})
	for i := range again {
		again[i].Epoch = ep
	}
	if !semSameDeliveries(again, all[2:]) {
		t.Errorf("re-offered = %s, want %s identical", semShow(again), semShow(all[2:]))
	}
}

func semSameDeliveries(a, b []Delivery) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Conversation != y.Conversation || x.Recipient != y.Recipient || x.Seq != y.Seq || x.Kind != y.Kind ||
			x.Participant != y.Participant || !bytes.Equal(x.Payload, y.Payload) || x.Cause != y.Cause || x.Epoch != y.Epoch {
			return false
		}
	}
	return true
}

func TestSemantics_WakesCoalesce(t *testing.T) {
	e := newSemEnv(t, Options{})
	c1, c2 := e.conn(), e.conn()
	e.enroll(c1, 1)
	e.enroll(c1, 2)
	s1 := e.enroll(c2, 1) // wakes c1 (joined)
	s2 := e.enroll(c2, 2) // c1 already has something ready
	e.tell(c2, s1, "a")
	e.tell(c2, s2, "b")
	if n := c1.wakes.Load(); n != 1 {
		t.Errorf("wakes before TakeReady = %d, want 1", n)
	}
	if got := c1.TakeReady(); len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("TakeReady = %v, want [1 2]", got)
	}
	if c1.HasReady() {
		t.Errorf("HasReady after TakeReady")
	}
	e.tell(c2, s2, "c")
	e.tell(c2, s1, "d")
	if n := c1.wakes.Load(); n != 2 {
		t.Errorf("wakes after the second round = %d, want 2", n)
	}
	if got := c1.TakeReady(); len(got) != 2 || got[0] != 2 {
		t.Errorf("TakeReady = %v, want [2 1]", got)
	}
	if n := c2.wakes.Load(); n != 0 {
		t.Errorf("the sender was woken %d times", n)
	}
}

func TestSemantics_Replays(t *testing.T) {
	e := newSemEnv(t, Options{ReceiptTTL: time.Minute})
	c1, c2, c3 := e.conn(), e.conn(), e.conn()
	en := Enroll{Conversation: 1, Token: e.tok()}
	a, err := c1.Enroll(e.ctx, en)
	if err != nil {
		t.Fatal(err)
	}
	if a.ReceiptExpiresAt != e.clock.Now().Add(time.Minute) {
		t.Errorf("ReceiptExpiresAt = %v, want now+ttl %v", a.ReceiptExpiresAt, e.clock.Now().Add(time.Minute))
	}
	wantBound := a
	wantBound.Replay = ReplayBound
	// Replayed on whichever connection, even one holding nothing.
	if got, err := c2.Enroll(e.ctx, en); err != nil || got != wantBound {
		t.Errorf("Enroll replay = %+v, %v, want %+v", got, err, wantBound)
	}
	e.enroll(c2, 1) // p1, so that detach records have a recipient
	dt := Detach{Conversation: 1, Participant: 0, Generation: 1, Token: e.tok()}
	d, err := c1.Detach(e.ctx, dt)
	if err != nil {
		t.Fatal(err)
	}
	wantUnbound := a
	wantUnbound.Replay = ReplayUnbound
	if got, err := c1.Enroll(e.ctx, en); err != nil || got != wantUnbound {
		t.Errorf("Enroll replay after detach = %+v, %v, want %+v", got, err, wantUnbound)
	}
	wantD := d
	wantD.Replay = ReplayCommitted
	if got, err := c3.Detach(e.ctx, dt); err != nil || got != wantD {
		t.Errorf("Detach replay = %+v, %v, want %+v", got, err, wantD)
	}
	// attach: replays bound, then superseded by a later attach.
	at := Attach{Conversation: 1, Participant: 0, Generation: 1, Secret: a.Secret, Token: e.tok()}
	b, err := c3.Attach(e.ctx, at)
	if err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 || b.Secret == a.Secret {
		t.Errorf("Attach = g%v, want g2 with a new secret", b.Generation)
	}
	wantB := b
	wantB.Replay = ReplayBound
	if got, err := c1.Attach(e.ctx, at); err != nil || got != wantB {
		t.Errorf("Attach replay = %+v, %v, want %+v", got, err, wantB)
	}
	other := at
	other.Generation = 2
	other.Secret = b.Secret
	_, err = c3.Attach(e.ctx, other)
	semCheckErr(t, "Attach replay with another presented generation", err, semWant{code: CodeTokenConflict})
	wrong := at
	wrong.Secret = semBadSecret
	_, err = c3.Attach(e.ctx, wrong)
	semCheckErr(t, "Attach replay with a wrong secret", err, semWant{code: CodeStaleAuthority})
	_, err = c3.Enroll(e.ctx, en)
	semCheckErr(t, "Enroll replay after an attach", err, semWant{code: CodeReceiptExpired, participant: 0, gen: 2, hasGen: true, reason: "superseded"})
	// A tell with another payload conflicts; the same tell replays.
	tl := Tell{Conversation: 1, Participant: 0, Generation: 2, Token: e.tok(), Payload: []byte("p")}
	told, err := c3.Tell(e.ctx, tl)
	if err != nil {
		t.Fatal(err)
	}
	tl2 := tl
	tl2.Payload = []byte("q")
	_, err = c3.Tell(e.ctx, tl2)
	semCheckErr(t, "Tell replay with another payload", err, semWant{code: CodeTokenConflict})
	if got, err := c3.Tell(e.ctx, tl); err != nil || got.Seq != told.Seq || got.Replay != ReplayCommitted {
		t.Errorf("Tell replay = %+v, %v, want seq %v committed", got, err, told.Seq)
	}
	// The deadline: at exactly now+ttl the receipt is gone.
	e.clock.Advance(time.Minute - time.Millisecond)
	if got, err := c1.Attach(e.ctx, at); err != nil || got != wantB {
		t.Errorf("Attach replay just before the deadline = %+v, %v", got, err)
	}
	e.clock.Advance(time.Millisecond)
	_, err = c1.Attach(e.ctx, at)
	semCheckErr(t, "Attach replay after the deadline", err, semWant{code: CodeReceiptExpired, participant: 0, gen: 2, hasGen: true, reason: "deadline"})
	// A wrong secret still loses to nothing but the kind/generation match.
	_, err = c1.Attach(e.ctx, wrong)
	semCheckErr(t, "expired Attach replay with a wrong secret", err, semWant{code: CodeStaleAuthority})
	// Tell and detach replays never expire.
	if got, err := c1.Tell(e.ctx, tl); err != nil || got.Seq != told.Seq {
		t.Errorf("Tell replay after the deadline = %+v, %v", got, err)
	}
	// Across a restart everything still replays, and the binding died.
	e.restart()
	c4 := e.conn()
	if got, err := c4.Detach(e.ctx, dt); err != nil || got != wantD {
		t.Errorf("Detach replay after restart = %+v, %v", got, err)
	}
	_, err = c4.Attach(e.ctx, at)
	semCheckErr(t, "Attach replay after restart", err, semWant{code: CodeReceiptExpired, participant: 0, gen: 2, hasGen: true, reason: "deadline"})
	// A fresh attach within its ttl replays unbound once its binding died.
	at3 := Attach{Conversation: 1, Participant: 0, Generation: 2, Secret: b.Secret, Token: e.tok()}
	b3, err := c4.Attach(e.ctx, at3)
	if err != nil {
		t.Fatalf("Attach with the secret minted before the restart = %v", err)
	}
	e.restart()
	c5 := e.conn()
	wantB3 := b3
	wantB3.Replay = ReplayUnbound
	if got, err := c5.Attach(e.ctx, at3); err != nil || got != wantB3 {
		t.Errorf("Attach replay after its binding died = %+v, %v, want %+v", got, err, wantB3)
	}
	// The replayed secret works.
	if _, err := c5.Attach(e.ctx, Attach{Conversation: 1, Participant: 0, Generation: 3, Secret: b3.Secret, Token: e.tok()}); err != nil {
		t.Errorf("Attach with the replayed secret = %v", err)
	}
}

func TestSemantics_IDsAndReclaim(t *testing.T) {
	e := newSemEnv(t, Options{})
	c1, c2, c3 := e.conn(), e.conn(), e.conn()
	a := e.enroll(c1, 1)
	b := e.enroll(c2, 1)
	e.leave(c2, b)
	c := e.enroll(c3, 1)
	if a.Participant != 0 || b.Participant != 1 || c.Participant != 2 {
		t.Errorf("ids = %v %v %v, want 0 1 2 (never reused)", a.Participant, b.Participant, c.Participant)
	}
	if d := e.enroll(c2, 1); d.Participant != 3 {
		t.Errorf("id after a leave = %v, want 3", d.Participant)
	}
	// Records every recipient acknowledged are reclaimed.
	oc := e.conn()
	other := e.enroll(oc, 2)
	sender := e.conn()
	s := e.enroll(sender, 2)
	for i := 0; i < 3; i++ {
		e.tell(sender, s, "r")
	}
	st := e.svc.existing(2).loaded()
	if n := st.Records.Len(); n < 4 {
		t.Fatalf("retained records = %d before any ack", n)
	}
	e.ack(oc, other, 5)
	if n := e.svc.existing(2).loaded().Records.Len(); n != 0 {
		t.Errorf("retained records after the only recipient acked everything = %d, want 0", n)
	}
}

// TestSemantics_ByeAfterInDoubt: docs/PROTOCOL.md says bye ends the connection's
// bindings as detached/clean. After an in_doubt answer dropped the
// conversation's state, End(clean) must still record detached/clean.
func TestSemantics_ByeAfterInDoubt(t *testing.T) {
	e := newSemEnv(t, Options{})
	c1, c2 := e.conn(), e.conn()
	a := e.enroll(c1, 1)
	w := e.enroll(c2, 1)
	e.fs.SetRules(faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("outbox/"))))
	tl := Tell{Conversation: 1, Participant: a.Participant, Generation: 1, Token: e.tok(), Payload: []byte("x")}
	_, err := c1.Tell(e.ctx, tl)
	semCheckErr(t, "Tell with a failing outbox flush", err, semWant{code: CodeInDoubt})
	e.fs.SetRules()
	if err := c1.End(e.ctx, oplog.CauseClean); err != nil {
		t.Fatalf("End(clean) = %v", err)
	}
	got := semShow(semDrain(c2, 1, Offered{}))
	if want := "3 record p0=x, 4 detached p0/clean"; got != want {
		t.Errorf("deliveries to %v after in_doubt tell and bye = %s, want %s", w.Participant, got, want)
	}
}

// TestSemantics_InDoubtAttachFreesOldConnection: after an attach answered
// in_doubt that did commit, the superseded connection holds no binding of
// that conversation any more, so its per-connection capacity is free.
func TestSemantics_InDoubtAttachFreesOldConnection(t *testing.T) {
	e := newSemEnv(t, Options{MaxConversationsPerConn: 1})
	c1, c2 := e.conn(), e.conn()
	a := e.enroll(c1, 1)
	e.fs.SetRules(faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("outbox/"))))
	at := Attach{Conversation: 1, Participant: a.Participant, Generation: 1, Secret: a.Secret, Token: e.tok()}
	_, err := c2.Attach(e.ctx, at)
	semCheckErr(t, "Attach with a failing outbox append", err, semWant{code: CodeInDoubt})
	e.fs.SetRules()
	b, err := c2.Attach(e.ctx, at)
	if err != nil || b.Replay != ReplayBound || b.Generation != 2 {
		t.Fatalf("Attach retry = %+v, %v, want a bound replay of g2", b, err)
	}
	if got := c1.Bindings(); len(got) != 0 {
		t.Errorf("c1.Bindings() = %v after its binding was superseded, want none", got)
	}
	if _, err := c1.Enroll(e.ctx, Enroll{Conversation: 2, Token: e.tok()}); err != nil {
		t.Errorf("Enroll on the superseded connection = %v, want success (it holds no binding)", err)
	}
}
