package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// loadConfig is the shape of one load run.
type loadConfig struct {
	addr    string
	op      string // opTell, opEnroll or opMixed
	clients int
	// conns is how many connections carry the tell shape's clients
	// (participants), spread over them (spread); 0 means one each.
	conns         int
	conversations int // tell shape only; 0 means clients/2
	payload       int
	window        int // requests in flight per client (participant)
	enrollPerConn int // enroll shape: enrolls before the client reconnects
	verify        int // counted answers to replay after the run
	randomTokens  bool
	// rate caps the requests all clients send per second together (0: as
	// fast as the server answers), for a steady load whose effect on disk
	// does not depend on how busy the machine is.
	rate float64
	// coalesce drives the tell shape (without rate) from each
	// connection's reader: the next tell and the next ack are sent by the
	// callbacks of the answers and deliveries read, and leave together in
	// one write (benchConn.sendLater). Off, a goroutine sends the tells
	// and another the acks, each in a write of its own.
	coalesce bool
	// ackWithTell, with coalesce, holds a connection's ack of what was
	// delivered until it sends its next tell, and writes them together:
	// a client that piggybacks its acks. A diagnostic of what the acks
	// cost the server, not the benchmark's shape.
	ackWithTell bool
}

const (
	opTell   = "tell"
	opEnroll = "enroll"
	opMixed  = "mixed"
)

// Phases of a run; answers are counted only while measuring.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseDone
)

// loadRun is the state shared by every worker of one run.
type loadRun struct {
	cfg   loadConfig
	phase atomic.Int32
	// nonce makes this run's tokens and conversation ids its own, so runs
	// against one long-lived server never collide.
	nonce uint64
	body  []byte
	// limiter paces every worker's sends when cfg.rate is set; nil
	// otherwise.
	limiter *rate.Limiter

	workers []*worker
	// conns are the connections the workers share, with --conns; nil when
	// each worker has its own.
	conns []*benchConn
}

// shared reports whether the tell shape's participants share connections
// (--conns below --clients).
func (c loadConfig) shared() bool { return c.conns > 0 && c.conns < c.clients }

// worker is one client and what it counted: a connection of its own, or,
// with --conns, a participant bound on a connection it shares with others.
type worker struct {
	run   *loadRun
	index int
	kind  string // opTell or opEnroll
	conn  *benchConn

	// tell shape: the participant bound on conn. p and gen are set before
	// the load starts; bound is p for the reader goroutine, set when the
	// enroll's answer is read, so that a shared connection's demux can
	// check a delivery's recipient.
	conv  uint64
	p     uint64
	gen   uint64
	bound atomic.Uint64

	sem     chan struct{} // window slots
	n       atomic.Uint64 // tokens minted (the chained tells mint on the reader too)
	enrolls int           // enrolls on the current connection

	// Written by the reader goroutine (callbacks), read after the run.
	count    atomic.Uint64
	errCount atomic.Uint64
	lat      latencies
	// samples are the counted answers to replay after the run: the first
	// ones, which replay across everything the run did to the store
	// (compaction included), and in recent, a ring of the latest, which a
	// server running a token window still deduplicates however long the
	// run (it may forget the first ones by then: see verify).
	samples    []sample
	recent     []sample
	recentNext int
	firstErr   atomic.Pointer[string]

	// ack state: the reader records the highest seq delivered; the acker
	// sends cumulative acks, one in flight at a time.
	maxSeen atomic.Uint64
	nudge   chan struct{}
	acks    atomic.Uint64

	// chained: the tell shape without --rate, driven from the reader
	// goroutine: an answer's callback sends the next tell, and a delivery
	// or an ack's answer the next ack (driveChained, ackNext). stop ends the tells,
	// stopAcks the acks.
	chained bool
	// lazyAcks: chained, and acks wait for the next tell (ackWithTell).
	lazyAcks bool
	stop     atomic.Bool
	stopAcks atomic.Bool
	// ackMu guards acked and ackBusy, the chained acker's state.
	ackMu   sync.Mutex
	acked   uint64
	ackBusy bool
}

// sample is one counted answer to replay after the run.
type sample struct {
	req    wire.Message // the exact request, token included
	seq    uint64       // tell: the seq answered
	part   uint64       // enroll: the participant answered
	worker *worker
}

// token mints the next token of w: a UUIDv7 of the current time, so that
// a server running a token window accepts it. With --random-tokens it is
// the client library's (client.NewToken); else its other 74 bits are this
// run's nonce (24 bits), the worker (20 bits) and its counter (30 bits),
// unique in the run even where the counter wraps, since 2^30 tokens never
// share a millisecond.
func (w *worker) token() wire.Token {
	n := w.n.Add(1)
	if w.run.cfg.randomTokens {
		return client.NewToken()
	}
	now := time.Now().UnixMilli()
	nonce := w.run.nonce >> 40 // its 24 bits
	idx := uint64(w.index) & (1<<20 - 1)
	return wire.TokenV7(now, uint16(nonce>>12), (nonce&0xfff)<<50|idx<<30|n&(1<<30-1))
}

func (w *worker) fail(err error) {
	w.errCount.Add(1)
	s := err.Error()
	w.firstErr.CompareAndSwap(nil, &s)
}

// answered records one answer of a request sent at sent.
func (w *worker) answered(m wire.Message, sent time.Time, ok func(wire.Message) (sample, bool)) {
	// The slot is freed last, so that drain orders every write below before
	// the report reads it.
	defer func() { <-w.sem }()
	w.record(m, sent, ok)
}

// record counts one answer of a request sent at sent; answered without
// the slot.
func (w *worker) record(m wire.Message, sent time.Time, ok func(wire.Message) (sample, bool)) {
	switch e := m.(type) {
	case nil:
		if w.run.phase.Load() != phaseDone {
			w.fail(errConnClosed)
		}
		return
	case *wire.Error:
		w.fail(e)
		return
	}
	s, good := ok(m)
	if !good {
		w.fail(fmt.Errorf("unexpected answer %s %+v", m.Type(), m))
		return
	}
	if w.run.phase.Load() != phaseMeasure {
		return
	}
	n := w.count.Add(1)
	w.lat = append(w.lat, time.Since(sent))
	if n%7 != 1 {
		return
	}
	s.worker = w
	first, last := w.run.samplesPerWorker()
	switch {
	case len(w.samples) < first:
		w.samples = append(w.samples, s)
	case len(w.recent) < last:
		w.recent = append(w.recent, s)
	case last > 0:
		w.recent[w.recentNext] = s
		w.recentNext = (w.recentNext + 1) % last
	}
}

// samplesPerWorker splits a worker's share of --verify between the first
// counted answers and the latest.
func (r *loadRun) samplesPerWorker() (first, last int) {
	n := (r.cfg.verify + len(r.workers) - 1) / len(r.workers)
	return n - n/2, n / 2
}

// setup dials every worker and binds the tell shape's participants.
func (r *loadRun) setup(ctx context.Context) error {
	cfg := r.cfg
	tellClients := cfg.clients
	switch cfg.op {
	case opEnroll:
		tellClients = 0
	case opMixed:
		tellClients = cfg.clients / 2
	}
	convs := cfg.conversations
	if convs <= 0 {
		convs = max(1, tellClients/2)
	}
	r.body = make([]byte, cfg.payload)
	for i := range r.body {
		r.body[i] = byte(i)
	}
	for i := range cfg.clients {
		w := &worker{run: r, index: i, kind: opEnroll, sem: make(chan struct{}, cfg.window), nudge: make(chan struct{}, 1)}
		if i < tellClients {
			w.kind = opTell
			w.conv = r.nonce | uint64(i%convs)
			w.chained = cfg.coalesce && cfg.rate == 0
			w.lazyAcks = w.chained && cfg.ackWithTell
			w.ackBusy = w.chained // until ackChained starts the acks
		}
		r.workers = append(r.workers, w)
	}
	if cfg.shared() {
		return r.setupShared(ctx, cfg.conns)
	}
	// Dial in parallel: thousands of handshakes one by one take a while.
	return r.eachWorker(ctx, "client", (*worker).connect)
}

// close closes the run's connections: the shared ones (--conns), or
// every worker's own.
func (r *loadRun) close() {
	if r.conns != nil {
		for _, c := range r.conns {
			c.close()
		}
		return
	}
	for _, w := range r.workers {
		w.conn.close()
	}
}

// eachWorker runs f for every worker, 64 at a time, and returns every
// error, each naming its worker as what and its index.
func (r *loadRun) eachWorker(ctx context.Context, what string, f func(*worker, context.Context) error) error {
	errs := make(chan error, len(r.workers))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, w := range r.workers {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(w, ctx); err != nil {
				errs <- fmt.Errorf("%s %d: %w", what, w.index, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(errs chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
		if len(out) == 5 {
			break
		}
	}
	return out
}

// connect dials and, for the tell shape, enrolls in the worker's
// conversation.
func (w *worker) connect(ctx context.Context) error {
	c, err := dialBench(ctx, w.run.cfg.addr)
	if err != nil {
		return err
	}
	w.conn = c
	w.enrolls = 0
	if w.kind == opTell {
		c.onDelivery = w.delivered
	}
	c.start()
	if w.kind != opTell {
		return nil
	}
	return w.enroll(ctx)
}

// enroll binds the tell shape's participant in the worker's conversation
// on w.conn.
func (w *worker) enroll(ctx context.Context) error {
	ch := make(chan wire.Message, 1)
	err := w.conn.send(&wire.Enroll{Conversation: w.conv, Token: w.token()}, func(m wire.Message) {
		if e, ok := m.(*wire.Enrolled); ok {
			w.bound.Store(e.Participant) // before the reader reads a delivery for it
		}
		ch <- m
	})
	if err != nil {
		return fmt.Errorf("enroll: %w", err)
	}
	var m wire.Message
	select {
	case m = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("enroll: %w", ctx.Err())
	case <-time.After(30 * time.Second):
		return errors.New("bench: no answer to enroll in 30s")
	}
	switch e := m.(type) {
	case nil:
		return fmt.Errorf("enroll: %w", errConnClosed)
	case *wire.Enrolled:
		w.p, w.gen = e.Participant, e.Generation
		return nil
	case *wire.Error:
		return fmt.Errorf("enroll: %w", e)
	default:
		return fmt.Errorf("enroll answered %s", m.Type())
	}
}

// delivered runs on the reader goroutine for every push.
func (w *worker) delivered(d *wire.Delivery) {
	// The connection holds one binding in this conversation, so every push
	// of it is addressed to that binding (w.p may not be set yet: the
	// partner's joined can arrive before the enroll answer is read).
	if d.Conversation != w.conv {
		return
	}
	for {
		cur := w.maxSeen.Load()
		if d.Seq <= cur || w.maxSeen.CompareAndSwap(cur, d.Seq) {
			break
		}
	}
	if w.chained {
		if !w.lazyAcks {
			w.ackNext(true)
		}
		return
	}
	select {
	case w.nudge <- struct{}{}:
	default:
	}
}

// acker acknowledges deliveries cumulatively, one ack in flight at a time,
// so that every delivered tell is acked by its recipient without one ack
// per record.
func (w *worker) acker(ctx context.Context) {
	if w.chained {
		w.ackChained(ctx)
		return
	}
	var acked uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.nudge:
		}
		through := w.maxSeen.Load()
		if through <= acked {
			continue
		}
		m, err := w.conn.call(ctx, &wire.Ack{Conversation: w.conv, Participant: w.p, Generation: w.gen, Through: through})
		if err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("ack through %d: %w", through, err))
			}
			return
		}
		if _, ok := m.(*wire.Acked); !ok {
			w.fail(fmt.Errorf("ack answered %s", m.Type()))
			return
		}
		acked = through
		w.acks.Add(1)
		if w.maxSeen.Load() > acked {
			select {
			case w.nudge <- struct{}{}:
			default:
			}
		}
	}
}

// drive sends requests with at most window in flight until ctx ends, then
// waits for the answers in flight.
func (w *worker) drive(ctx context.Context) {
	defer w.drain()
	if w.chained {
		w.driveChained(ctx)
		return
	}
	for ctx.Err() == nil {
		select {
		case w.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if lim := w.run.limiter; lim != nil && lim.Wait(ctx) != nil {
			<-w.sem
			return
		}
		var err error
		if w.kind == opTell {
			err = w.sendTell()
		} else {
			err = w.sendEnroll(ctx)
		}
		if err != nil {
			if ctx.Err() == nil {
				w.fail(err)
			}
			<-w.sem
			return
		}
	}
}

// driveChained fills the window with tells; each answer's callback sends
// the next (sendTellChained) until ctx ends.
func (w *worker) driveChained(ctx context.Context) {
	for range cap(w.sem) {
		w.sem <- struct{}{}
		if err := w.sendTellChained(false); err != nil {
			if ctx.Err() == nil {
				w.fail(err)
			}
			<-w.sem
			return
		}
	}
	<-ctx.Done()
	w.stop.Store(true)
}

// sendTellChained sends a tell whose answer's callback, on the reader
// goroutine, counts it and sends the next one in its window slot, until
// stop; later says it runs on the reader goroutine (sendLater).
func (w *worker) sendTellChained(later bool) error {
	req := &wire.Tell{Conversation: w.conv, Participant: w.p, Generation: w.gen, Token: w.token(), Payload: w.run.body}
	sent := time.Now()
	done := func(m wire.Message) {
		w.record(m, sent, func(m wire.Message) (sample, bool) {
			t, ok := m.(*wire.Told)
			if !ok || t.Replay != nil {
				return sample{}, false
			}
			return sample{req: req, seq: t.Seq}, true
		})
		if m == nil || w.stop.Load() {
			<-w.sem
			return
		}
		if err := w.sendTellChained(true); err != nil {
			w.fail(err)
			<-w.sem
		}
	}
	if !later {
		return w.conn.send(req, done)
	}
	if w.lazyAcks {
		// In the same write as the tell, and before it: its answer then
		// comes before the told, and the next tell finds no ack in flight.
		w.ackNext(true)
	}
	return w.conn.sendLater(req, done)
}

// ackChained lets the reader acknowledge deliveries (ackNext) until ctx
// ends, starting with those delivered before the load began.
func (w *worker) ackChained(ctx context.Context) {
	w.ackMu.Lock()
	w.ackBusy = false
	w.ackMu.Unlock()
	w.ackNext(false)
	<-ctx.Done()
	w.stopAcks.Store(true)
}

// ackNext sends a cumulative ack through the highest seq delivered, unless
// one is in flight (its answer's callback then sends the next) or nothing
// new was delivered. later says it runs on the reader goroutine. Until
// ackChained starts the acks, ackBusy holds them back: the participant
// may not be bound yet.
func (w *worker) ackNext(later bool) {
	w.ackMu.Lock()
	through := w.maxSeen.Load()
	if w.ackBusy || through <= w.acked || w.stopAcks.Load() {
		w.ackMu.Unlock()
		return
	}
	w.ackBusy = true
	w.ackMu.Unlock()
	req := &wire.Ack{Conversation: w.conv, Participant: w.p, Generation: w.gen, Through: through}
	done := func(m wire.Message) {
		if m == nil {
			if !w.stopAcks.Load() {
				w.fail(fmt.Errorf("ack through %d: %w", through, errConnClosed))
			}
			return // ackBusy stays: the connection is gone
		}
		if _, ok := m.(*wire.Acked); !ok {
			w.fail(fmt.Errorf("ack through %d answered %s %+v", through, m.Type(), m))
			return
		}
		w.acks.Add(1)
		w.ackMu.Lock()
		w.acked = through
		w.ackBusy = false
		w.ackMu.Unlock()
		if !w.lazyAcks {
			w.ackNext(true)
		}
	}
	send := w.conn.send
	if later {
		send = w.conn.sendLater
	}
	if err := send(req, done); err != nil {
		if !w.stopAcks.Load() {
			w.fail(fmt.Errorf("ack through %d: %w", through, err))
		}
	}
}

// drain waits until every request in flight was answered.
func (w *worker) drain() {
	for range cap(w.sem) {
		w.sem <- struct{}{}
	}
	for range cap(w.sem) {
		<-w.sem
	}
}

func (w *worker) sendTell() error {
	req := &wire.Tell{Conversation: w.conv, Participant: w.p, Generation: w.gen, Token: w.token(), Payload: w.run.body}
	sent := time.Now()
	return w.conn.send(req, func(m wire.Message) {
		w.answered(m, sent, func(m wire.Message) (sample, bool) {
			t, ok := m.(*wire.Told)
			if !ok || t.Replay != nil {
				return sample{}, false
			}
			return sample{req: req, seq: t.Seq}, true
		})
	})
}

// sendEnroll enrolls in a new conversation. A connection holds at most one
// binding per conversation and a bounded number of them, so after
// enrollPerConn enrolls the worker says bye (the server ends those bindings
// as detached/clean, commits the bench does not count but the server's
// flush figures include) and reconnects.
func (w *worker) sendEnroll(ctx context.Context) error {
	if w.enrolls >= w.run.cfg.enrollPerConn {
		w.drainHeld()
		old := w.conn
		old.write(&wire.Bye{ID: old.nextID.Add(1)})
		<-old.readDone // the server closes after ending the bindings
		old.wc.Close()
		// Not the load's context: a reconnect cut short by the end of the
		// run would leave the worker without a connection to replay on.
		if err := w.connect(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("reconnect: %w", err)
		}
	}
	w.enrolls++
	conv := w.run.nonce | uint64(w.index+1)<<24 | w.n.Load()&(1<<24-1)
	req := &wire.Enroll{Conversation: conv, Token: w.token()}
	sent := time.Now()
	return w.conn.send(req, func(m wire.Message) {
		w.answered(m, sent, func(m wire.Message) (sample, bool) {
			e, ok := m.(*wire.Enrolled)
			if !ok || e.Replay != nil || e.Conversation != conv {
				return sample{}, false
			}
			return sample{req: req, part: e.Participant}, true
		})
	})
}

// drainHeld waits for every request in flight but the one whose slot the
// caller holds.
func (w *worker) drainHeld() {
	for range cap(w.sem) - 1 {
		w.sem <- struct{}{}
	}
	for range cap(w.sem) - 1 {
		<-w.sem
	}
}

// verify replays every sample with its original token and checks that the
// server answers with the original result, marked as a replay: proof that
// each sampled counted answer was a committed, durable operation. A server
// running a token window may have forgotten a sample's token once it was
// older than the window and its history compacted; the replay is then
// refused token_expired, which it may only be for a token older than the
// window: such a sample is counted as forgotten, neither verified nor
// failed.
func (r *loadRun) verify(ctx context.Context) (verified, forgotten int, failures []string) {
	for _, w := range r.workers {
		for _, s := range append(append([]sample(nil), w.samples...), w.recent...) {
			err := w.replay(ctx, s)
			switch {
			case errors.Is(err, errForgotten):
				forgotten++
				continue
			case err != nil:
				failures = append(failures, err.Error())
			}
			verified++
		}
	}
	return verified, forgotten, failures
}

// requestToken returns the token of a sampled request (tell or enroll).
func requestToken(m wire.Message) wire.Token {
	switch m := m.(type) {
	case *wire.Tell:
		return m.Token
	case *wire.Enroll:
		return m.Token
	}
	return wire.Token{}
}

// errForgotten is a replay refused token_expired for a token older than
// the window the server announced (its oldest).
var errForgotten = errors.New("the server's token window forgot the token")

func (w *worker) replay(ctx context.Context, s sample) error {
	m, err := w.conn.call(ctx, s.req)
	if e, ok := errors.AsType[*wire.Error](err); ok && e.Code == wire.CodeTokenExpired {
		ms, _ := requestToken(s.req).UnixMilli()
		if e.Oldest != nil && ms < int64(*e.Oldest) {
			return errForgotten
		}
		return fmt.Errorf("replay %s: token_expired with oldest %v for a token of %d ms", s.req.Type(), e.Oldest, ms)
	}
	if err != nil {
		return fmt.Errorf("replay %s: %w", s.req.Type(), err)
	}
	switch a := m.(type) {
	case *wire.Told:
		if a.Replay == nil || *a.Replay != wire.ReplayCommitted || a.Seq != s.seq {
			return fmt.Errorf("replay tell: got seq %d replay %v, want seq %d replay committed", a.Seq, a.Replay, s.seq)
		}
	case *wire.Enrolled:
		if a.Replay == nil || a.Participant != s.part {
			return fmt.Errorf("replay enroll: got participant %d replay %v, want participant %d as a replay", a.Participant, a.Replay, s.part)
		}
	default:
		return fmt.Errorf("replay %s answered %s", s.req.Type(), m.Type())
	}
	return nil
}

// newNonce returns a random conversation-id prefix for a run: the top 24
// bits, so that ids of different runs never meet.
func newNonce() uint64 { return rand.Uint64() &^ (1<<40 - 1) }
