package participanttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/internal/peek"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// Model feeds the same random operations to a service and to a reference
// model, with crash-restarts and in_doubt faults, and compares every
// answer, every participant's deliveries and the connections' wakes. Each
// sequence runs over a fresh store of Backend, and a restart crashes it
// through Backend.Crash.
type Model struct {
	Backend faultstore.Backend
	// Iters is the number of sequences, Ops the operations of each.
	Iters, Ops int
	// Seed is the seed of the first sequence; each next one adds one.
	Seed uint64
	// Rerun is the command that reruns the test, for failure messages; it
	// is given -model.iters=1 -model.seed=N.
	Rerun string
}

// Run plays the sequences, stopping at the first failure.
func (m Model) Run(t testing.TB) {
	t.Helper()
	t.Logf("seed %d (rerun: %s -model.seed=%d)", m.Seed, m.Rerun, m.Seed)
	outcomes := make(map[string]int)
	for i := 0; i < m.Iters; i++ {
		r := newModelRun(t, m, m.Seed+uint64(i))
		r.outcomes = outcomes
		ok := r.run(m.Ops)
		r.close()
		if !ok {
			return
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

var modelOpts = participant.Options{ReceiptTTL: 20 * time.Second, MaxRecordBytes: 8, MaxParticipants: 5, MaxConversationsPerConn: 2, MaxBacklogRecords: 16}

// modelConn is a live connection, named by an int that is never reused.
type modelConn struct {
	id  int
	c   semConn
	sig map[participant.ConversationID]string // deliveries seen at the last check
}

type modelRun struct {
	t     testing.TB
	model Model
	seed  uint64
	rng   *rand.Rand
	ctx   context.Context
	st    store.DurableStore
	fs    *faultstore.Store
	svc   *participant.Service
	clock *semClock
	ref   *refModel
	conns []*modelConn
	next  int
	toks  uint64
	// issued are the token-bearing requests sent so far, for retries.
	issued  []refReq
	history []string
	// afterFault is set when the last op left the conversation dropped.
	afterFault bool
	secretSeen map[participant.Secret]refCred
	// outcomes counts answers by request kind and code, for coverage.
	outcomes map[string]int
	opts     participant.Options
	// lastConn is the connection of the last request.
	lastConn *modelConn
	// clocks is the clock fault model (see clockModes).
	clocks clockMode
	// realMs is the true time; the service's clock reads realMs+offsetMs,
	// and tokens are drawn at realMs plus up to half the skew (clients'
	// clocks, a little ahead).
	realMs, offsetMs int64
	// tokTimes are the times of the tokens drawn, forgetMax the highest
	// "now minus the window" of a compaction pass, and floorBound one past
	// the newest token drawn below it: no persisted floor can be higher,
	// since a pass forgets only tokens older than its now minus the window.
	tokTimes              []int64
	forgetMax, floorBound int64
}

// clockMode is how a model run's clock behaves.
type clockMode int

const (
	// clockSteady advances 0-3 s a step.
	clockSteady clockMode = iota
	// clockJumps advances 1-3 s a step and, now and then, steps forward
	// (beyond the token window: minutes to hours) or back (to the true
	// time, or an hour before it); a restart is, half the time, a node
	// whose clock is skewed by up to 5 s either way (under the window,
	// half the skew).
	clockJumps
	// clockJumpsWindow is clockJumps under a token window, with
	// checkpoint and compaction passes between steps, so that tokens are
	// forgotten and floors persisted while the clock is wrong.
	clockJumpsWindow
	clockModes
)

func (c clockMode) String() string {
	return [...]string{clockSteady: "steady clock", clockJumps: "jumping clocks", clockJumpsWindow: "jumping clocks, token window"}[c]
}

// modelWindow and modelSkew are the token window and skew of
// clockJumpsWindow runs.
const (
	modelWindow = 10 * time.Second
	modelSkew   = time.Second
)

func newModelRun(t testing.TB, m Model, seed uint64) *modelRun {
	r := &modelRun{t: t, model: m, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), ctx: context.Background(),
		st: m.Backend.Fresh(t), clock: newSemClock(), secretSeen: make(map[participant.Secret]refCred)}
	r.opts = modelOpts
	if seed%2 == 1 {
		// One binding per connection: capacity refusals are frequent.
		r.opts.MaxConversationsPerConn = 1
	}
	// Half the seeds read a batch's token index entries ahead, as cluster
	// mode does: the answers must not change.
	r.opts.PrefetchTokens = seed/2%2 == 1
	r.clocks = clockMode(seed / 4 % uint64(clockModes))
	r.realMs = r.clock.Now().UnixMilli()
	if r.clocks == clockJumpsWindow {
		r.opts.TokenWindow, r.opts.TokenSkew = modelWindow, modelSkew
		r.opts.CheckpointRows, r.opts.Retain = 1, time.Millisecond
	}
	r.ref = newRefModel(r.opts)
	r.open()
	return r
}

func (r *modelRun) open() {
	r.fs = faultstore.New(r.st)
	opts := r.opts
	opts.NodeKey = semKey
	opts.Now = r.clock.Now
	svc, err := participant.Open(r.ctx, r.fs, opts)
	if err != nil {
		r.fail("Open: %v", err)
	}
	r.svc = svc
	r.conns = nil
	for range 3 {
		r.connect()
	}
}

// close closes the service and releases the store.
func (r *modelRun) close() {
	r.svc.Close()
	if r.model.Backend.Release != nil {
		r.model.Backend.Release(r.t, r.st)
	}
}

// stats returns the counters of the store.
func (r *modelRun) stats() store.Stats {
	sr, ok := r.st.(interface{ Stats() store.Stats })
	if !ok {
		r.fail("the store %T reports no Stats", r.st)
	}
	return sr.Stats()
}

func (r *modelRun) connect() {
	r.next++
	r.conns = append(r.conns, &modelConn{id: r.next, c: connect(r.svc), sig: make(map[participant.ConversationID]string)})
}

func (r *modelRun) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("seed %d, %v (rerun: %s -model.iters=1 -model.seed=%d):\n%s\nhistory:\n  %s",
		r.seed, r.clocks, r.model.Rerun, r.seed, fmt.Sprintf(format, args...), strings.Join(r.history, "\n  "))
}

func (r *modelRun) log(format string, args ...any) {
	r.history = append(r.history, fmt.Sprintf("%3d ", len(r.history))+fmt.Sprintf(format, args...))
}

func (r *modelRun) tok() participant.Token {
	r.toks++
	var t participant.Token
	t[0] = 0x3c
	for i := 0; i < 8; i++ {
		t[8+i] = byte(r.toks >> (8 * i))
	}
	if r.clocks != clockJumpsWindow {
		return t
	}
	// A UUIDv7 drawn by a client whose clock is up to half the skew
	// ahead: a step advances the true time by more than that, so a token
	// of a later step is always newer than every token of the earlier
	// ones.
	ms := r.realMs + r.rng.Int64N(modelSkew.Milliseconds()/2)
	r.tokTimes = append(r.tokTimes, ms)
	stampV7(&t, ms)
	t[9] = byte(r.toks >> 6)
	return t
}

// retriable reports whether q's token may be sent again. Under a token
// window, not when a compaction pass may have forgotten it or persisted
// a floor above it: the model does not know which tokens a pass forgot
// (the cut loops check those retries), so the floor never decides an
// answer and a floor in the future shows as a refused fresh token.
func (r *modelRun) retriable(q refReq) bool {
	if r.clocks != clockJumpsWindow {
		return true
	}
	ms, _ := tokenTime(q.tok)
	return ms >= r.floorBound
}

// tick advances the clocks before a step; under clockJumps the service's
// clock sometimes steps forward or back.
func (r *modelRun) tick() {
	if r.clocks == clockSteady {
		r.clock.Advance(time.Duration(r.rng.IntN(3000)) * time.Millisecond)
		r.realMs = r.clock.Now().UnixMilli()
		return
	}
	r.realMs += 1000 + r.rng.Int64N(2000)
	if r.rng.IntN(25) == 0 {
		switch k := r.rng.IntN(4); k {
		case 0, 1:
			// Forward, past the window and the receipts' lifetime.
			r.offsetMs += (time.Minute + time.Duration(r.rng.Int64N(int64(2*time.Hour)))).Milliseconds()
		case 2:
			r.offsetMs = 0 // corrected
		case 3:
			r.offsetMs -= time.Duration(r.rng.Int64N(int64(time.Hour))).Milliseconds()
		}
		r.log("the clock steps to true time %+dms", r.offsetMs)
	}
	r.clock.Set(r.realMs + r.offsetMs)
}

// passes runs a checkpoint and a compaction pass, as the daemon's
// background passes do, and notes how far the compaction may have
// forgotten tokens.
func (r *modelRun) passes() {
	if _, err := r.svc.CheckpointPass(r.ctx); err != nil {
		r.fail("CheckpointPass: %v", err)
	}
	got, err := r.svc.CompactPass(r.ctx)
	if err != nil {
		r.fail("CompactPass: %v", err)
	}
	r.log("passes at %+dms: %+v", r.offsetMs, got)
	r.noteDeleted(got.Deleted)
	if r.outcomes != nil && got.Forgotten > 0 {
		r.outcomes["passes:forgot"]++
		if r.offsetMs > modelWindow.Milliseconds() {
			r.outcomes["passes:forgot-clock-ahead"]++
		}
	}
	r.forgetMax = max(r.forgetMax, r.clock.Now().Add(-modelWindow).UnixMilli())
	for _, ms := range r.tokTimes {
		if ms < r.forgetMax {
			r.floorBound = max(r.floorBound, ms+1)
		}
	}
}

// noteDeleted marks in the model the conversations the pass deleted, n of
// them by its count: a deleted conversation must be one every member of
// which had left.
func (r *modelRun) noteDeleted(n int) {
	found := 0
	for _, conv := range r.ref.convIDs() {
		c := r.ref.convs[conv]
		if c.deleted {
			continue
		}
		deleted, err := Deleted(r.st, conv)
		if err != nil {
			r.fail("conversation %v: %v", conv, err)
			return
		}
		if !deleted {
			continue
		}
		if !c.allLeft() {
			r.fail("conversation %v was deleted while a member had not left", conv)
			return
		}
		c.deleted = true
		found++
		if r.outcomes != nil {
			r.outcomes["passes:deleted"]++
		}
	}
	if found != n {
		r.fail("the pass reports %d conversations deleted, the store holds %d more", n, found)
	}
}

// run plays n operations; it returns false after a failure.
func (r *modelRun) run(n int) bool {
	for i := 0; i < n && !r.t.Failed(); i++ {
		r.tick()
		r.ref.nowMs = r.clock.Now().UnixMilli()
		r.step()
		r.checkRecords()
		r.checkDeliveries()
	}
	return !r.t.Failed()
}

func (r *modelRun) pickConn() *modelConn { return r.conns[r.rng.IntN(len(r.conns))] }

func (r *modelRun) connByID(id int) *modelConn {
	for _, c := range r.conns {
		if c.id == id {
			return c
		}
	}
	return nil
}

func (r *modelRun) pickConv() participant.ConversationID {
	if r.rng.IntN(20) == 0 {
		return 9 // never enrolled into, except by a rare enroll
	}
	conv := participant.ConversationID(1 + r.rng.IntN(3))
	if r.ref.convs[conv] == nil && r.rng.IntN(4) != 0 {
		if ids := r.ref.convIDs(); len(ids) > 0 {
			conv = ids[r.rng.IntN(len(ids))]
		}
	}
	return conv
}

// pickParticipant returns a participant of conv, sometimes one that does
// not exist.
func (r *modelRun) pickParticipant(conv participant.ConversationID) (participant.ParticipantID, *refMember) {
	c := r.ref.convs[conv]
	n := 0
	if c != nil {
		n = len(c.members)
	}
	if n == 0 || r.rng.IntN(15) == 0 {
		return participant.ParticipantID(n + r.rng.IntN(2)), nil
	}
	p := participant.ParticipantID(r.rng.IntN(n))
	// Prefer a participant that is bound, then one that has not left.
	for range 3 {
		if mb := c.members[p]; mb.bound || (!mb.retired && r.rng.IntN(3) == 0) {
			break
		}
		p = participant.ParticipantID(r.rng.IntN(n))
	}
	return p, c.members[p]
}

// credential picks a generation and secret for p: mostly the current one,
// sometimes a stale one with its right secret, a wrong secret or a future
// generation.
func (r *modelRun) credential(conv participant.ConversationID, p participant.ParticipantID, mb *refMember) (participant.Generation, participant.Secret) {
	g := participant.Generation(1)
	if mb != nil {
		g = mb.gen
	}
	switch k := r.rng.IntN(10); {
	case k == 0 && g > 1:
		old := participant.Generation(1 + r.rng.IntN(int(g-1)))
		return old, r.ref.secrets[refCred{conv, p, old}]
	case k == 1:
		return g, participant.Secret{byte(r.rng.IntN(256)), 7}
	case k == 2:
		return g + 1, participant.Secret{9}
	}
	return g, r.ref.secrets[refCred{conv, p, g}]
}

func (r *modelRun) generation(mb *refMember) participant.Generation {
	g := participant.Generation(1)
	if mb != nil {
		g = mb.gen
	}
	switch r.rng.IntN(12) {
	case 0:
		if g > 1 {
			return g - 1
		}
	case 1:
		return g + 1
	}
	return g
}

// requestConn is the connection a binding-needing request comes from:
// mostly the binding's own.
func (r *modelRun) requestConn(mb *refMember) *modelConn {
	if mb != nil && mb.bound && r.rng.IntN(4) != 0 {
		if c := r.connByID(mb.conn); c != nil {
			return c
		}
	}
	return r.pickConn()
}

func (r *modelRun) randomRequest() (refReq, *modelConn) {
	conv := r.pickConv()
	switch k := r.rng.IntN(100); {
	case k < 14:
		if conv == 9 && r.rng.IntN(4) != 0 {
			conv = 1
		}
		return refReq{kind: "enroll", conv: conv, tok: r.tok()}, r.pickConn()
	case k < 28:
		p, mb := r.pickParticipant(conv)
		g, s := r.credential(conv, p, mb)
		return refReq{kind: "attach", conv: conv, p: p, gen: g, secret: s, tok: r.tok()}, r.pickConn()
	case k < 52:
		p, mb := r.pickParticipant(conv)
		payload := make([]byte, r.rng.IntN(5))
		if r.rng.IntN(15) == 0 {
			payload = make([]byte, 9+r.rng.IntN(3))
		}
		for i := range payload {
			payload[i] = byte('a' + r.rng.IntN(26))
		}
		return refReq{kind: "tell", conv: conv, p: p, gen: r.generation(mb), tok: r.tok(), payload: payload}, r.requestConn(mb)
	case k < 75:
		p, mb := r.pickParticipant(conv)
		return refReq{kind: "ack", conv: conv, p: p, gen: r.generation(mb), through: r.through(conv, p, mb)}, r.requestConn(mb)
	case k < 94:
		p, mb := r.pickParticipant(conv)
		return refReq{kind: "detach", conv: conv, p: p, gen: r.generation(mb), tok: r.tok()}, r.requestConn(mb)
	default:
		p, mb := r.pickParticipant(conv)
		g, s := r.credential(conv, p, mb)
		c := r.requestConn(mb)
		if r.rng.IntN(3) != 0 && mb != nil && mb.bound {
			// Leaves are rare and final; let most of them fail.
			s = participant.Secret{1}
		}
		return refReq{kind: "leave", conv: conv, p: p, gen: g, secret: s, tok: r.tok()}, c
	}
}

// through picks an ack target: mostly a record addressed to p after its
// cursor, else the cursor (noop), below it (regression) or a gap.
func (r *modelRun) through(conv participant.ConversationID, p participant.ParticipantID, mb *refMember) participant.Seq {
	if mb == nil {
		return participant.Seq(r.rng.IntN(5))
	}
	last := r.ref.lastSeq(conv)
	var pending []participant.Seq
	for _, rec := range r.ref.convs[conv].records {
		if rec.seq > mb.cursor && rec.to[p] {
			pending = append(pending, rec.seq)
		}
	}
	switch k := r.rng.IntN(10); {
	case k < 6 && len(pending) > 0:
		// Mostly the first few, as a client acks in order.
		return pending[r.rng.IntN(min(len(pending), 3))]
	case k == 6:
		return mb.cursor
	case k == 7 && mb.cursor > 0:
		return participant.Seq(r.rng.IntN(int(mb.cursor)))
	}
	return mb.cursor + 1 + participant.Seq(r.rng.IntN(int(last-mb.cursor)+2))
}

// retry returns an earlier token-bearing request, exactly or altered in
// one way that the protocol answers with token_conflict or stale_authority.
func (r *modelRun) retry() (refReq, *modelConn, bool) {
	if len(r.issued) == 0 {
		return refReq{}, nil, false
	}
	q := r.issued[r.rng.IntN(len(r.issued))]
	if !r.retriable(q) {
		return refReq{}, nil, false
	}
	q.payload = bytes.Clone(q.payload)
	switch r.rng.IntN(8) {
	case 0:
		if q.kind == "tell" {
			q.payload = append(q.payload, 'X')
		}
	case 1:
		if q.kind == "attach" {
			q.gen++
			q.secret = r.ref.secrets[refCred{q.conv, q.p, q.gen}]
		}
	case 2:
		if q.kind == "attach" {
			q.secret[31] ^= 1
		}
	case 3:
		// The same token for another kind of request of that participant.
		kinds := []string{"attach", "tell", "detach", "leave"}
		if q.kind != "enroll" {
			q.kind = kinds[r.rng.IntN(len(kinds))]
		}
	}
	return q, r.pickConn(), true
}

func (r *modelRun) step() {
	k := r.rng.IntN(100)
	if r.afterFault && r.lastConn != nil && r.rng.IntN(3) == 0 {
		k = 5 // end the connection whose commit just failed
	}
	switch {
	case k < 3:
		r.restart()
		return
	case k < 8 && r.clocks == clockJumpsWindow && r.rng.IntN(3) != 0:
		r.passes()
		return
	case k < 8:
		i := r.rng.IntN(len(r.conns))
		if k == 5 && r.lastConn != nil {
			for j, c := range r.conns {
				if c == r.lastConn {
					i = j
				}
			}
		}
		c := r.conns[i]
		causes := []participant.Cause{1, 3, 4, 5} // clean, shutdown, connection_lost, protocol_error
		cause := causes[r.rng.IntN(len(causes))]
		r.log("c%d: End(%v)", c.id, cause)
		if r.afterFault && r.outcomes != nil {
			r.outcomes["end-after-fault:"+cause.String()]++
		}
		if err := c.c.End(r.ctx, cause); err != nil {
			r.fail("End(%v) = %v", cause, err)
		}
		r.ref.end(c.id, cause)
		r.conns = append(r.conns[:i], r.conns[i+1:]...)
		r.connect()
		r.afterFault = false
		return
	case k < 22:
		if q, c, ok := r.retry(); ok {
			r.do(q, c, "retry ")
			return
		}
	case k < 32:
		q, c := r.randomRequest()
		r.doFaulted(q, c)
		return
	case k < 40:
		r.pipelined()
		return
	}
	q, c := r.randomRequest()
	r.do(q, c, "")
}

// restart crashes the store once everything answered is durable, and opens
// a new service on it: every binding of the old incarnation dies.
func (r *modelRun) restart() {
	r.log("crash and restart")
	r.svc.Close()
	r.st = r.model.Backend.Crash(r.t, r.st)
	if r.clocks != clockSteady && r.rng.IntN(2) == 0 {
		// Another node's clock, skewed: under the window, by less than
		// the skew, or every token would be ahead of it.
		r.offsetMs = r.rng.Int64N(10_000) - 5_000
		if r.clocks == clockJumpsWindow {
			r.offsetMs = r.rng.Int64N(modelSkew.Milliseconds()) - modelSkew.Milliseconds()/2
		}
		r.clock.Set(r.realMs + r.offsetMs)
		r.ref.nowMs = r.clock.Now().UnixMilli()
		r.log("restarted on a clock %+dms off", r.offsetMs)
	}
	r.open()
	r.ref.restart()
	r.afterFault = false
}

// svcDo runs q on the service from c.
func (r *modelRun) svcDo(q refReq, c *modelConn) refAnswer {
	return r.svcStart(q, c)()
}

// svcStart queues q on the service from c and returns the function that
// waits for its answer.
func (r *modelRun) svcStart(q refReq, c *modelConn) func() refAnswer {
	r.lastConn = c
	switch q.kind {
	case "enroll":
		call := c.c.StartEnroll(r.ctx, participant.Enroll{Conversation: q.conv, Token: q.tok})
		return func() refAnswer {
			b, err := call.Wait()
			return r.answer(q, r.bound(b), b.Conversation, err)
		}
	case "attach":
		call := c.c.StartAttach(r.ctx, participant.Attach{Conversation: q.conv, Participant: q.p, Generation: q.gen, Secret: q.secret, Token: q.tok})
		return func() refAnswer {
			b, err := call.Wait()
			return r.answer(q, r.bound(b), b.Conversation, err)
		}
	case "tell":
		call := c.c.StartTell(r.ctx, participant.Tell{Conversation: q.conv, Participant: q.p, Generation: q.gen, Token: q.tok, Payload: bytes.Clone(q.payload)})
		return func() refAnswer {
			t, err := call.Wait()
			return r.answer(q, refAnswer{seq: t.Seq, replay: t.Replay}, t.Conversation, err)
		}
	case "ack":
		call := c.c.StartAck(r.ctx, participant.Ack{Conversation: q.conv, Participant: q.p, Generation: q.gen, Through: q.through})
		return func() refAnswer {
			k, err := call.Wait()
			return r.answer(q, refAnswer{p: k.Participant, cursor: k.Cursor, noop: k.Noop}, k.Conversation, err)
		}
	case "detach", "leave":
		var call *participant.Call[participant.Ended]
		if q.kind == "detach" {
			call = c.c.StartDetach(r.ctx, participant.Detach{Conversation: q.conv, Participant: q.p, Generation: q.gen, Token: q.tok})
		} else {
			call = c.c.StartLeave(r.ctx, participant.Leave{Conversation: q.conv, Participant: q.p, Generation: q.gen, Secret: q.secret, Token: q.tok})
		}
		return func() refAnswer {
			e, err := call.Wait()
			return r.answer(q, refAnswer{p: e.Participant, seq: e.Seq, replay: e.Replay}, e.Conversation, err)
		}
	}
	r.fail("unknown request kind %q", q.kind)
	return nil
}

// answer turns the service's outcome of q into a refAnswer: a, answered
// for conversation conv, or err.
func (r *modelRun) answer(q refReq, a refAnswer, conv participant.ConversationID, err error) refAnswer {
	if err != nil {
		var pe *participant.Error
		if !errors.As(err, &pe) {
			r.fail("%v = %v, not an *Error", q, err)
		}
		w := semWant{code: pe.Code, cursor: pe.Cursor, limit: pe.Limit, participant: pe.Participant, reason: pe.Reason}
		if pe.HasGeneration {
			w.gen, w.hasGen = pe.Generation, true
		}
		return refAnswer{err: w}
	}
	if conv != q.conv {
		r.fail("%v answered conversation %v", q, conv)
	}
	return a
}

func (r *modelRun) bound(b participant.Bound) refAnswer {
	a := refAnswer{p: b.Participant, gen: b.Generation, cursor: b.Cursor, replay: b.Replay, secret: b.Secret}
	if !b.ReceiptExpiresAt.IsZero() {
		a.expiresMs = b.ReceiptExpiresAt.UnixMilli()
	}
	return a
}

func (r *modelRun) remember(q refReq) {
	if q.kind != "ack" {
		r.issued = append(r.issued, q)
	}
}

// do runs q on both sides and compares the answers.
func (r *modelRun) do(q refReq, c *modelConn, note string) {
	r.remember(q)
	before := r.stats()
	got := r.svcDo(q, c)
	want := r.ref.apply(q, c.id)
	r.count(q, got)
	r.log("c%d: %s%v -> %v", c.id, note, q, got)
	r.compare(q, got, want)
	if !r.afterFault && (want.err.code != "" || want.replay != participant.ReplayNone || want.noop) {
		if after := r.stats(); after.Appends != before.Appends || after.CASWrites != before.CASWrites {
			r.fail("%v answered %v and wrote to the store: %+v, before %+v", q, got, after, before)
		}
	}
	r.afterFault = false
}

func (r *modelRun) count(q refReq, a refAnswer) {
	if r.outcomes == nil {
		return
	}
	k := q.kind + ":"
	switch {
	case a.err.code != "":
		k += string(a.err.code)
		if a.err.reason != "" {
			k += "/" + a.err.reason
		}
	case a.replay != participant.ReplayNone:
		k += string(a.replay)
	case a.noop:
		k += "noop"
	default:
		k += "ok"
	}
	r.outcomes[k]++
}

// compare checks the service's answer against the model's, secrets by
// value, and learns the secrets of new credentials.
func (r *modelRun) compare(q refReq, got, want refAnswer) {
	r.t.Helper()
	if got.comparable() != want.comparable() && !r.ref.unknownEither(q, got, want) {
		r.fail("%v:\n got %v\nwant %v", q, got, want)
	}
	if got.err.code != "" || (q.kind != "enroll" && q.kind != "attach") {
		r.ref.pendingSecretToLearn = nil
		return
	}
	if want.replay != participant.ReplayNone {
		if got.secret != want.secret {
			r.fail("%v: replayed secret differs from the one first answered", q)
		}
		return
	}
	r.learn(q, got.secret)
}

// learn records the secret of the credential the model's last commit
// minted; a fresh secret never repeats an earlier one.
func (r *modelRun) learn(q refReq, s participant.Secret) {
	r.t.Helper()
	for _, cred := range r.ref.pendingSecretToLearn {
		if prev, dup := r.secretSeen[s]; dup {
			r.fail("%v: secret of %+v repeats the secret of %+v", q, cred, prev)
		}
		r.secretSeen[s] = cred
		r.ref.secrets[cred] = s
	}
	r.ref.pendingSecretToLearn = nil
}

// doFaulted runs q with one storage fault armed. A request the model
// refuses or replays never reaches the store's writes and answers as
// usual; one that would commit answers in_doubt (or unavailable when the
// fault hits before the first append), and a retry with the same token
// tells whether it committed.
func (r *modelRun) doFaulted(q refReq, c *modelConn) {
	type fault struct {
		name string
		rule faultstore.Rule
		code participant.Code
	}
	faults := []fault{
		{"fail outbox append", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("outbox/")), participant.CodeInDoubt},
		{"fail outbox flush", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("outbox/")), participant.CodeInDoubt},
		{"fail oplog append", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("oplog/")), participant.CodeInDoubt},
		{"uncertain oplog append", faultstore.When(faultstore.Uncertain, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("oplog/")), participant.CodeInDoubt},
		{"fail oplog flush", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("oplog/")), participant.CodeInDoubt},
		{"fail token index", faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpCAS), faultstore.Prefix(tokenindex.Prefix)), participant.CodeUnavailable},
	}
	f := faults[r.rng.IntN(len(faults))]
	if q.kind == "ack" && f.code == participant.CodeUnavailable {
		f = faults[0] // an ack has no token to index
	}
	r.remember(q)
	// What the model answers if nothing fails.
	committed := r.ref.clone()
	want := committed.apply(q, c.id)
	fresh := want.err.code == "" && want.replay == participant.ReplayNone && !want.noop
	if !fresh {
		r.ref.pendingSecretToLearn = nil
		r.do(q, c, "["+f.name+", not reached] ")
		return
	}
	r.fs.SetRules(faultstore.Once(f.rule))
	got := r.svcDo(q, c)
	r.fs.SetRules()
	r.log("c%d: [%s] %v -> %v", c.id, f.name, q, got)
	r.count(q, got)
	// A fault before the op's first append (a flush of the registry that
	// still covers an earlier failed outbox flush, say) is unavailable:
	// nothing committed, which later answers check.
	if got.err != (semWant{code: f.code}) && got.err != (semWant{code: participant.CodeUnavailable}) {
		r.fail("%v with %s = %v, want %s", q, f.name, got, f.code)
	}
	r.afterFault = true
	if got.err.code == participant.CodeUnavailable {
		// Nothing was committed: the model stays as it was.
		return
	}
	// Retry on the same connection: the model accepts either outcome and
	// follows the one the service shows.
	notCommitted := r.ref.clone()
	wantNot := notCommitted.apply(q, c.id)
	wantCom := committed.apply(q, c.id)
	retry := r.svcDo(q, c)
	r.outcomes["in_doubt-retry:"+q.kind+":"+string(retry.replay)]++
	r.log("c%d: retry %v -> %v", c.id, q, retry)
	switch {
	case retry.comparable() == wantCom.comparable():
		// It committed: the replay shows the secret the lost answer held.
		r.ref = committed
		if q.kind == "enroll" || q.kind == "attach" {
			r.learn(q, retry.secret)
		}
	case retry.comparable() == wantNot.comparable():
		r.ref = notCommitted
		r.compare(q, retry, wantNot)
	default:
		r.fail("retry of in_doubt %v:\n got %v\nwant %v (committed) or %v (not committed)", q, retry, wantCom, wantNot)
	}
	r.ref.pendingSecretToLearn = nil
	r.afterFault = false
}

// checkDeliveries drains every live connection in every conversation and
// compares with the model; a connection with new work must have been woken.
func (r *modelRun) checkDeliveries() {
	for _, c := range r.conns {
		woken := c.c.HasReady()
		c.c.TakeReady()
		for _, conv := range []participant.ConversationID{1, 2, 3, 9} {
			if r.dropped(conv) {
				// Dropped by a failed commit: nothing is published until
				// the next touch reconciles it.
				continue
			}
			p, g, want, bound := r.ref.deliveries(conv, c.id)
			got := semDrain(c.c, conv, participant.Offered{})
			if !bound {
				if len(got) > 0 {
					r.fail("c%d in conv %v holds no binding and is offered %s", c.id, conv, semShow(got))
				}
				delete(c.sig, conv)
				continue
			}
			epoch := participant.Epoch{Conn: c.c.ID(), Generation: g}
			if len(got) != len(want) {
				r.fail("c%d conv %v (%v): offered %s, want %d records %s", c.id, conv, p, semShow(got), len(want), refShow(want))
			}
			for i, d := range got {
				w := want[i]
				if d.Conversation != conv || d.Recipient != p || d.Seq != w.seq || d.Kind != w.kind || d.Participant != w.subject ||
					d.Cause != w.cause || !bytes.Equal(d.Payload, w.payload) || d.Epoch != epoch {
					r.fail("c%d conv %v (%v): offered %s, want %s (epoch %+v)", c.id, conv, p, semShow(got), refShow(want), epoch)
				}
			}
			sig := ""
			if len(want) > 0 {
				sig = fmt.Sprintf("%+v/%v", epoch, want[len(want)-1].seq)
			}
			if sig != "" && sig != c.sig[conv] && !woken {
				r.fail("c%d conv %v (%v): new deliveries %s and no wake", c.id, conv, p, refShow(want))
			}
			c.sig[conv] = sig
		}
	}
}

// checkRecords compares every record the service still retains, with its
// recipients, and the last seq, with the model's records.
func (r *modelRun) checkRecords() {
	for _, conv := range r.ref.convIDs() {
		if r.ref.convs[conv].deleted {
			continue
		}
		var last participant.Seq
		var bad string
		loaded := false
		known := peek.State(r.svc, conv, func(st *outbox.State) {
			if st == nil {
				return
			}
			loaded = true
			last = st.LastSeq
			for _, rec := range st.Records.All() {
				if int(rec.Seq) > len(r.ref.convs[conv].records) {
					bad = fmt.Sprintf("record %v beyond the model's", rec.Seq)
					break
				}
				w := r.ref.convs[conv].records[rec.Seq-1]
				to := make(map[participant.ParticipantID]bool)
				for _, p := range rec.Recipients() {
					to[p] = true
				}
				if rec.Kind != w.kind || rec.Participant != w.subject || rec.Cause != w.cause || !bytes.Equal(rec.Payload(), w.payload) || !maps.Equal(to, w.to) {
					bad = fmt.Sprintf("record %v is %v %v %v %q to %v, want %v", rec.Seq, rec.Kind, rec.Participant, rec.Cause, rec.Payload(), rec.Recipients(), refShow([]refRecord{w}))
					break
				}
			}
		})
		if !known {
			r.fail("conversation %v exists in the model only", conv)
		}
		if !loaded {
			continue
		}
		if bad != "" {
			r.fail("conv %v: %s", conv, bad)
		}
		if want := r.ref.lastSeq(conv); last != want {
			r.fail("conv %v: last seq %v, want %v", conv, last, want)
		}
	}
}

// dropped reports whether the service holds conversation conv without its
// state, as after a failed commit dropped it: nothing is published until
// the next touch reconciles it.
func (r *modelRun) dropped(conv participant.ConversationID) bool {
	loaded := false
	known := peek.State(r.svc, conv, func(st *outbox.State) { loaded = st != nil })
	return known && !loaded
}

func refShow(rs []refRecord) string {
	ds := make([]participant.Delivery, len(rs))
	for i, x := range rs {
		ds[i] = participant.Delivery{Seq: x.seq, Kind: x.kind, Participant: x.subject, Cause: x.cause, Payload: x.payload}
	}
	return semShow(ds)
}

// pipelined plays requests of one conversation that the service decides
// in one batch, as a client pipelining them would have them decided: it
// holds the conversation's turn while it queues them (and, for one shape,
// another connection's end), so whoever takes the turn next leads them all
// together. The shapes start and end one participant's binding within the
// batch; the model applies them one by one in queue order and every answer
// must match.
func (r *modelRun) pipelined() {
	conv := r.pickConv()
	qs, conns, end := r.batchShape(conv)
	if len(qs) == 0 {
		return
	}
	queuedOps, release := peek.HoldTurn(r.svc, conv)
	if end != nil && r.dropped(conv) {
		// A reload is due (a failed commit dropped the state): it would
		// end the ending connection's binding before the batch, an order
		// as valid as the model's but not the model's.
		end = nil
	}
	waits := make([]func() refAnswer, len(qs))
	for i, q := range qs {
		waits[i] = r.svcStart(q, conns[i])
	}
	var endDone chan error
	cause := participant.Cause(4) // connection_lost
	if end != nil {
		// End waits for the connection's own operations (it has none in
		// this batch), then queues the ending of its binding here.
		endDone = make(chan error, 1)
		go func() { endDone <- end.c.End(r.ctx, cause) }()
		for queuedOps() <= len(qs) {
			runtime.Gosched()
		}
	}
	release()
	note := fmt.Sprintf("batch of %d ", len(qs))
	for i, q := range qs {
		got := waits[i]()
		r.remember(q)
		want := r.ref.apply(q, conns[i].id)
		r.count(q, got)
		if r.outcomes != nil {
			r.outcomes["pipelined:"+q.kind]++
		}
		r.log("c%d: %s%v -> %v", conns[i].id, note, q, got)
		r.compare(q, got, want)
	}
	if end != nil {
		if err := <-endDone; err != nil {
			r.fail("End(%v) in a batch = %v", cause, err)
		}
		r.log("c%d: batched End(%v)", end.id, cause)
		r.ref.end(end.id, cause)
		for j, c := range r.conns {
			if c == end {
				r.conns = append(r.conns[:j], r.conns[j+1:]...)
				break
			}
		}
		r.connect()
	}
	r.afterFault = false
}

// batchShape picks a batch that starts and ends one participant's binding
// in conv: enroll then detach, enroll then leave, attach then detach,
// attach then a superseding attach then detach, or an attach superseding
// another connection's binding then that connection's end. The
// participant, generation and secrets are what the model predicts, so that
// most of these commit; a prediction gone wrong is just a refusal, which
// the model checks as well.
func (r *modelRun) batchShape(conv participant.ConversationID) (qs []refReq, conns []*modelConn, end *modelConn) {
	add := func(q refReq, c *modelConn) {
		qs, conns = append(qs, q), append(conns, c)
	}
	rc := r.ref.convs[conv]
	next := participant.ParticipantID(0)
	if rc != nil {
		next = participant.ParticipantID(len(rc.members))
	}
	c := r.pickConn()
	switch k := r.rng.IntN(6); {
	case k == 5 && rc != nil:
		// Retries of earlier tells in conv, some with another payload:
		// replays, token_conflicts and repeats of one token decided
		// together (and, under PrefetchTokens, read ahead together).
		var tells []refReq
		for _, q := range r.issued {
			if q.kind == "tell" && q.conv == conv && r.retriable(q) {
				tells = append(tells, q)
			}
		}
		for range min(len(tells), 4) {
			q := tells[r.rng.IntN(len(tells))]
			q.payload = bytes.Clone(q.payload)
			if r.rng.IntN(4) == 0 {
				q.payload = append(q.payload, 'X')
			}
			add(q, r.pickConn())
		}
	case k == 0 || rc == nil:
		add(refReq{kind: "enroll", conv: conv, tok: r.tok()}, c)
		add(refReq{kind: "detach", conv: conv, p: next, gen: 1, tok: r.tok()}, c)
	case k == 1:
		add(refReq{kind: "enroll", conv: conv, tok: r.tok()}, c)
		add(refReq{kind: "leave", conv: conv, p: next, gen: 1, secret: r.futureSecret(conv, next, 1), tok: r.tok()}, c)
	case k == 2:
		p, mb := r.pickParticipant(conv)
		g, s := r.credential(conv, p, mb)
		add(refReq{kind: "attach", conv: conv, p: p, gen: g, secret: s, tok: r.tok()}, c)
		add(refReq{kind: "detach", conv: conv, p: p, gen: g + 1, tok: r.tok()}, c)
	case k == 3:
		p, mb := r.pickParticipant(conv)
		g, s := r.credential(conv, p, mb)
		// One connection: a connection's binding count is its published
		// bookkeeping, which a binding superseded earlier in the same
		// batch has not left yet.
		add(refReq{kind: "attach", conv: conv, p: p, gen: g, secret: s, tok: r.tok()}, c)
		add(refReq{kind: "attach", conv: conv, p: p, gen: g + 1, secret: r.futureSecret(conv, p, g+1), tok: r.tok()}, c)
		add(refReq{kind: "detach", conv: conv, p: p, gen: g + 2, tok: r.tok()}, c)
	default:
		// A bound participant, attached from another connection, whose
		// old connection then ends in the same batch.
		for i, mb := range rc.members {
			holder := r.connByID(mb.conn)
			if !mb.bound || holder == nil || !slices.ContainsFunc(holder.c.Bindings(), func(b participant.Binding) bool { return b.Conversation == conv }) {
				continue
			}
			for c == holder {
				c = r.pickConn()
			}
			p := participant.ParticipantID(i)
			add(refReq{kind: "attach", conv: conv, p: p, gen: mb.gen, secret: r.ref.secrets[refCred{conv, p, mb.gen}], tok: r.tok()}, c)
			add(refReq{kind: "detach", conv: conv, p: p, gen: mb.gen + 1, tok: r.tok()}, c)
			return qs, conns, holder
		}
	}
	return qs, conns, nil
}

// futureSecret is the secret the service mints for credential (conv, p,
// g), derived as the service does from the conversation's nonce, or a
// wrong one when the conversation is not loaded. The model learns it now:
// the service verifies it whether or not that generation is ever minted.
func (r *modelRun) futureSecret(conv participant.ConversationID, p participant.ParticipantID, g participant.Generation) participant.Secret {
	var nonce *[16]byte
	peek.State(r.svc, conv, func(st *outbox.State) {
		if st != nil && st.Applied != 0 {
			n := st.Nonce
			nonce = &n
		}
	})
	if nonce == nil {
		return participant.Secret{2}
	}
	s := participant.Secret(peek.DeriveSecret(semKey, *nonce, conv, p, g))
	r.ref.secrets[refCred{conv, p, g}] = s
	return s
}
