package participant

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/tokenindex"
)

// A step decides one operation within a batch (see batch.go). It runs on
// the goroutine holding the conversation's turn, against the batch's
// working state, and either stages rows or settles on an answer at once.
// It returns the operation's completion: called once the batch's writes
// are known, with nil when they are durable (or nothing was written) and
// with their error otherwise, it sets the caller's answer and returns the
// operation's error.
type step func(b *batch) (complete func(writeErr error) error)

// commit stages o and returns the completion that sets the operation's
// answer with answer once o is durable.
func (b *batch) commit(o *op, answer func()) func(error) error {
	if err := b.stage(o); err != nil {
		return settled(err)
	}
	return func(werr error) error {
		if werr == nil {
			answer()
		}
		return werr
	}
}

// settled completes with e (or nil) unless the batch's writes failed: a
// refusal or replay decided after a failed commit in the same batch may
// rest on it, so it shares its outcome.
func settled(e error) func(error) error {
	return func(werr error) error {
		if werr != nil {
			return werr
		}
		return e
	}
}

// task is one operation waiting in a conversation's queue.
type task struct {
	step step
	// tok names the token index entry step looks up first.
	tok tokenRef
	// link is the span of the request that queued the task, which its
	// batch's span links to; invalid when tracing is off.
	link trace.SpanContext
	// started is when the operation was started (zero: not timed);
	// stages is where its time went, set with err.
	started time.Time
	stages  Stages
	err     error
	done    chan struct{}
	// plain is set for a tell or an ack, whose completion needs no turn:
	// a batch of plain tasks may hand the turn on before its commit is
	// durable (pipeline.go).
	plain bool
	// taken is set once a batch took the task from the queue: its
	// outcome is on its way, and its waiter need not take the turn.
	taken atomic.Bool
}

// Call is an operation queued on its conversation whose outcome is not
// known yet. Operations started on one conversation, from any number of
// connections, are decided and answered in the order they were started,
// and those queued together share barriers; so a caller that starts a
// connection's pipelined requests in order and waits for them in order
// gets both the protocol's ordering and group commit within a
// conversation. Wait must be called exactly once.
type Call[T any] struct {
	v    T
	wait func() error
	// stages is the queued task's, nil when the operation was refused
	// before it was queued.
	stages *Stages
}

// Wait waits for the outcome and returns the answer or the *Error.
func (c *Call[T]) Wait() (T, error) {
	err := c.wait()
	return c.v, err
}

// Stages returns where the operation's time went (zero for one refused
// before it reached its conversation's queue). It may be called only
// after Wait.
func (c *Call[T]) Stages() Stages {
	if c.stages == nil {
		return Stages{}
	}
	return *c.stages
}

// queue queues st, the decision of the operation sp describes, on its
// conversation for this connection and returns its task (whose stages
// are set with its outcome) and the function that waits for the outcome;
// or the refusal that kept it from being queued. started is when the
// operation started, for its Stages.
func (c *Conn) queue(ctx context.Context, sp opSpec, st step, started time.Time) (t *task, wait func() error, err error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil, nil, refuse(CodeUnavailable, "the connection has ended")
	}
	c.inflight.Add(1)
	c.mu.Unlock()
	refused := func(e error) (*task, func() error, error) {
		c.inflight.Done()
		return nil, nil, e
	}
	if c.svc.isDraining() {
		return refused(refuse(CodeShuttingDown, "the server is draining"))
	}
	// Every operation pins its entry until it is answered, so that no
	// entry is forgotten (unpin) while an operation may still register it
	// (an enroll's genesis, a fresh ownership grant).
	var cv *conversation
	if sp.creates {
		cv = c.svc.pin(sp.conv)
	} else if cv = c.svc.pinExisting(sp.conv); cv == nil {
		var err error
		if cv, err = c.svc.adopt(ctx, sp.conv); err != nil {
			return refused(err)
		}
		if cv == nil {
			return refused(refuse(CodeUnknownParticipant, "no conversation %v", sp.conv))
		}
	}
	t = cv.enqueue(st, sp.tok, c.svc.requestSpan(ctx), started, sp.name == "tell" || sp.name == "ack")
	return t, func() error {
		defer c.inflight.Done()
		err := c.svc.await(ctx, cv, t)
		c.svc.unpin(cv)
		return err
	}, nil
}

// submit queues step on cv and waits for its outcome.
func (s *Service) submit(ctx context.Context, cv *conversation, st step) error {
	return s.await(ctx, cv, cv.enqueue(st, tokenRef{}, s.requestSpan(ctx), time.Time{}, false))
}

// enqueue appends a task for step, which looks up tok, to cv's queue;
// link is the span of the request it serves, if traced; started is when
// the operation started, for its Stages (zero: not timed); plain is set
// for a tell or an ack (task.plain).
func (cv *conversation) enqueue(st step, tok tokenRef, link trace.SpanContext, started time.Time, plain bool) *task {
	t := &task{step: st, tok: tok, link: link, started: started, done: make(chan struct{}), plain: plain}
	cv.qmu.Lock()
	cv.queue = append(cv.queue, t)
	cv.qmu.Unlock()
	return t
}

// await waits for t's outcome. Operations are decided in queue order:
// whoever takes the conversation's turn decides and commits everything
// queued so far as one batch, so concurrent operations on one conversation
// share barriers. Once a batch took t, its waiter only waits: the turn
// may be free before t's outcome is known (a batch in flight handed it
// on), and the operations queued after t have waiters of their own.
func (s *Service) await(ctx context.Context, cv *conversation, t *task) error {
	for !t.taken.Load() {
		select {
		case <-t.done:
			return t.err
		case cv.turn <- struct{}{}:
			// Once the turn's holder hands it on with t in its batch,
			// in flight (pipeline.go), t is taken: its waiter takes the
			// turn no more, or it would take it, find the queue empty
			// and give it back, in a loop, until t's batch is done.
			s.lead(cv)
		case <-ctx.Done():
			if cv.unqueue(t) {
				return &Error{Code: CodeUnavailable, Detail: "waiting for the conversation", cause: ctx.Err()}
			}
			// Already being decided: its outcome is on its way.
			<-t.done
			return t.err
		}
	}
	<-t.done
	return t.err
}

// unqueue removes t from the queue, reporting whether it was still there.
func (cv *conversation) unqueue(t *task) bool {
	cv.qmu.Lock()
	defer cv.qmu.Unlock()
	for i, q := range cv.queue {
		if q == t {
			cv.queue = append(cv.queue[:i], cv.queue[i+1:]...)
			return true
		}
	}
	return false
}

// lead runs one batch: the caller holds cv's turn, which lead releases,
// or hands on to the next batch before its commit is durable
// (pipeline.go).
func (s *Service) lead(cv *conversation) {
	handedOn := false
	defer func() {
		if !handedOn {
			s.release(cv)
		}
	}()
	cv.qmu.Lock()
	n := min(len(cv.queue), maxBatch)
	tasks := append([]*task(nil), cv.queue[:n]...)
	cv.queue = append(cv.queue[:0], cv.queue[n:]...)
	cv.qmu.Unlock()
	if len(tasks) == 0 {
		s.idleTurns.Add(1)
		return
	}
	for _, t := range tasks {
		t.taken.Store(true)
	}
	prev := cv.inflight
	if prev != nil && !prev.finished() && cv.contained() {
		// Contained since prev was decided: this batch is refused as the
		// load refuses it (ensureLoadedTurn), once prev is done.
		_ = prev.wait() // its outcome is its own batch's
	}
	if prev != nil && prev.finished() {
		prev, cv.inflight = nil, nil
	}
	// After the wait for a contained conversation's batch in flight: it
	// is the tasks' Turn, as the wait for a batch that keeps its turn is.
	began := time.Now()
	var b *batch
	if prev != nil {
		// The batch before this one handed the turn on with its commit
		// in flight: this one decides on its working state.
		b = s.batchAfter(cv, prev)
		s.pipelined.Add(1)
	} else {
		live, err := s.ensureLoadedTurn(s.ctx, cv)
		if err != nil {
			s.noteStoreErr(err)
			k := batchClock{began: began, failed: true}
			done := time.Now()
			for _, t := range tasks {
				t.err = err
				t.stages = k.stages(t.started, done)
				close(t.done)
			}
			return
		}
		b = s.newBatch(cv, live)
	}
	b.clock.began = began
	if s.tracer != nil {
		b.startBatch(tasks)
	}
	if s.opts.PrefetchTokens {
		b.prefetchTokens(tasks)
	}
	completes := make([]func(error) error, len(tasks))
	firstStaged := len(tasks)
	for i, t := range tasks {
		if b.st.Deleted {
			// A Delete staged earlier in this batch ends the conversation.
			completes[i] = settled(errDeleted(cv.id))
			continue
		}
		staged := len(b.ops)
		completes[i] = t.step(b)
		if len(b.ops) > staged && firstStaged == len(tasks) {
			firstStaged = i
		}
	}
	var werr error
	switch {
	case b.pipelines(tasks):
		werr = b.writePipelined(func() {
			handedOn = true
			s.release(cv)
		})
	case prev != nil:
		// Decided on the state of a batch still in flight: its outcome
		// first (a replay of its rows is answered only once they are
		// durable), and its failure is this batch's.
		if perr := b.prevOutcome(); perr != nil {
			werr = b.failAfter(perr)
		} else {
			werr = b.write()
		}
	default:
		werr = b.write()
	}
	if b.afterFailed {
		// Every decision of the batch rested on the failed one's state.
		firstStaged = 0
	}
	b.endBatch(werr)
	done := time.Now()
	for i, t := range tasks {
		var e error
		if i >= firstStaged {
			e = werr
		}
		t.err = completes[i](e)
		t.stages = b.clock.stages(t.started, done)
		s.noteStoreErr(t.err)
		close(t.done)
	}
	if b.done != nil {
		b.werr = werr
		close(b.done)
	}
}

func (c *Conn) decider(conv ConversationID) *decider {
	o := &c.svc.opts
	return &decider{
		key:             o.NodeKey,
		conv:            conv,
		conn:            c.id,
		now:             c.svc.now(),
		maxRecordBytes:  o.MaxRecordBytes,
		maxParticipants: o.MaxParticipants,
		maxConnBindings: o.MaxConversationsPerConn,
		requireInvite:   o.EnrollPolicy == EnrollInvite,
		dataBytes:       o.DataBytes,
		maxDataBytes:    o.MaxDataBytes,
		restoredFrom:    o.RestoredFrom,
	}
}

func (s *Service) replayer(conv ConversationID) *replayer {
	return &replayer{key: s.opts.NodeKey, conv: conv, now: s.now(), ttl: s.opts.ReceiptTTL, requireInvite: s.opts.EnrollPolicy == EnrollInvite}
}

// asError turns a nil *Error into a nil error.
func asError(e *Error) error {
	if e == nil {
		return nil
	}
	return e
}

func unavailable(what string, err error) error {
	return &Error{Code: CodeUnavailable, Detail: what, cause: err}
}

func anyRow(*oplog.Row) bool { return true }

func byParticipant(p ParticipantID) func(*oplog.Row) bool {
	return func(r *oplog.Row) bool { return r.Participant == p }
}

// lookupParticipant resolves a participant-scoped token; a participant that does not
// exist has committed nothing (its token still passes the token window
// first, as the order of checks puts the token before the participant).
func (b *batch) lookupParticipant(p ParticipantID, t Token) (*prior, tokenWrite, error) {
	if b.st.Member(p) == nil {
		return nil, tokenWrite{}, b.s.admitToken(b.cv, t)
	}
	return b.lookup(tokenindex.Participant(p), byParticipant(p), t)
}

// endParallelism bounds how many of a connection's bindings End ends at
// once.
const endParallelism = 64

// End ends the connection: it waits for the operations in flight, then ends
// every binding the connection holds with cause (connection_lost or
// protocol_error as `died`; clean or shutdown as `detached`), each through
// the two barriers, and forgets the connection. A binding whose ending
// cannot be committed now (an unloadable conversation, a failing store) ends
// as died/unclean_restart at the next start. End is idempotent.
func (c *Conn) End(ctx context.Context, cause Cause) error {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil
	}
	c.ended, c.endCause = true, cause
	c.mu.Unlock()
	c.unparkAll()
	c.inflight.Wait()
	// The bindings are in different conversations, so their endings commit
	// concurrently and share group commits. No binding is added to the
	// connection from here on: a batch publishes its binding before its
	// operation completes, which the wait above covers, and a load
	// publishes none on a connection marked ended (rebind, under c.mu as
	// the mark and the list below are): it ends the binding it finds
	// itself, with this cause.
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, endParallelism)
	)
	for _, bd := range c.Bindings() {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := c.svc.endBinding(ctx, bd.Conversation, bd.Participant, c.id, cause); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	c.svc.mu.Lock()
	delete(c.svc.conns, c.id)
	c.svc.unshareLocked(c.share)
	c.svc.mu.Unlock()
	return firstErr
}

// endBinding commits the end of p's binding on conn in conversation id, if
// it still holds it.
func (s *Service) endBinding(ctx context.Context, id ConversationID, p ParticipantID, conn ConnID, cause Cause) (err error) {
	defer s.observe("end", time.Now(), &err, "")
	cv := s.existing(id)
	if cv == nil {
		return nil
	}
	return s.submit(ctx, cv, func(b *batch) func(error) error {
		return settled(b.stageEnd(p, conn, cause))
	})
}

// stageEnd stages the end of p's binding on conn, if p still holds it
// there.
func (b *batch) stageEnd(p ParticipantID, conn ConnID, cause Cause) error {
	row, ok := end(b.st, p, conn, cause, b.s.now())
	if !ok {
		return nil
	}
	return b.stage(&op{row: row, ending: b.endingOf(p), ended: &superseded{conn: conn, p: p}})
}
