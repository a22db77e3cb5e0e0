package server

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// convQueue is one conversation's requests on a connection, from read
// to answered. Its requests run in groups: a group takes every request
// read and not yet begun, starts each on the service in the order read,
// waits for their outcomes (its goroutine leads their batch) and, once the
// group before it has answered, answers them in the same order. A request
// read while a group waits for its outcomes starts a group of its own at
// once: the service decides it behind the earlier ones, on the state of
// their batch while its commit is in flight (participant's pipelined
// batches), instead of after their answers. Groups begin one at a time
// (beginning), so the service sees the connection's requests in the
// order read, and answer one after another (each waits for last).
// Guarded by conn.mu.
type convQueue struct {
	// reqs are the requests read and not yet begun, in the order read.
	reqs []request
	// beginning is set while a group is starting (or about to start) on
	// reqs: a request read meanwhile joins reqs, and the group, once
	// begun, starts the next group for it.
	beginning bool
	// last is closed once the last group begun has sent its answers.
	last chan struct{}
}

// submit queues m, whose frame holds held bytes of the pending budgets
// (reserve took them before its body was read; the request gives them
// back once answered), behind the earlier requests of conversation conv,
// starting a group for it unless one is beginning. It blocks while
// MaxPending requests are queued or running: the reader then stops reading
// (TCP backpressure), as it does while reserve waits for budget. It
// returns false, having given the bytes back, if the connection's writer
// is gone meanwhile. read is when m's frame was read.
func (c *conn) submit(conv uint64, m wire.Operation, held int64, read time.Time) bool {
	select {
	case c.pending <- struct{}{}:
	case <-c.out.done:
		c.release(held)
		return false
	}
	c.mu.Lock()
	q := c.queues[conv]
	if q == nil {
		q = &convQueue{}
		c.queues[conv] = q
	}
	q.reqs = append(q.reqs, request{m: m, held: held, read: read})
	idle := !q.beginning
	q.beginning = true
	c.mu.Unlock()
	if idle {
		c.group(conv, q)
	}
	return true
}

// group starts a group on q's requests (see convQueue).
func (c *conn) group(conv uint64, q *convQueue) {
	c.workers.Add(1)
	c.srv.work.run(func() { c.work(conv, q) })
}

// work runs one group of conversation conv's requests: it takes the
// requests read and not yet begun, starts each on the service, hands the
// requests read meanwhile to the next group, waits for the outcomes,
// waits for the group before it to answer, and answers. The service
// decides the requests started together in one batch (unless another
// batch took the queue between two of them), and their answers leave
// under one hold of the outbound queue.
func (c *conn) work(conv uint64, q *convQueue) {
	defer c.workers.Done()
	c.mu.Lock()
	reqs := q.reqs
	q.reqs = nil
	prev, mine := q.last, make(chan struct{})
	q.last = mine
	c.mu.Unlock()

	answers := make([]func() (wire.Message, participant.Stages), len(reqs))
	// spans are the requests' spans when tracing is on (trace.go).
	var spans []trace.Span
	if c.srv.tracer != nil {
		spans = make([]trace.Span, len(reqs))
	}
	start := time.Now()
	for i, r := range reqs {
		ctx := c.srv.opCtx
		if spans != nil {
			ctx, spans[i] = c.startRequest(conv, r.m)
		}
		answers[i] = c.begin(ctx, r.m)
	}
	c.mu.Lock()
	next := len(q.reqs) > 0
	q.beginning = next
	c.mu.Unlock()
	if next {
		c.group(conv, q)
	}

	type answered struct {
		a   wire.Message
		st  participant.Stages
		now time.Time
	}
	outs := make([]answered, len(reqs))
	for i, answer := range answers {
		a, st := answer() // always waited for: the service counts it in flight
		outs[i] = answered{a: a, st: st, now: c.touch()}
		answers[i] = nil
	}
	// An answer waits for the earlier groups' answers: that wait is its
	// wake's (for a batch in flight completes before the one decided on
	// it, it is short).
	var after time.Time
	if prev != nil {
		select {
		case <-prev:
		default:
			<-prev
			after = c.touch()
		}
	}
	// The requests begun together are decided in one batch (unless
	// another batch took the queue between two of them): their answers
	// are queued under one hold.
	c.out.hold()
	for i, o := range outs {
		op := opIndex(reqs[i].m)
		if o.now.Before(after) {
			o.now = after
		}
		c.srv.metrics.stages.answered(op, reqs[i].read, start, o.now, o.st)
		var sp trace.Span
		if spans != nil {
			sp, spans[i] = spans[i], nil
		}
		c.logRequest(reqs[i].m, o.a, conv, start, sp)
		switch {
		case sp != nil:
			c.sendTraced(sp, o.a)
		case !c.abandon.Load():
			c.out.sendHeldTimed(o.a, timing{stages: &c.srv.metrics.stages.by[op], read: reqs[i].read, queued: o.now})
		}
		c.release(reqs[i].held)
		reqs[i], outs[i] = request{}, answered{} // let the request's bytes go
		<-c.pending
	}
	// The batch that answered these published its deliveries before it
	// completed them: when the pump has some to send, the answers wait
	// for them and leave in the same write.
	c.out.release(!c.pc.HasReady())

	close(mine)
	c.mu.Lock()
	if q.last == mine && !q.beginning {
		delete(c.queues, conv)
	}
	c.mu.Unlock()
}

// logRequest logs one answered request at debug level: what was asked,
// what was answered and how long it took from when its batch started.
// sp, if not nil, is the request's span, whose trace and span ids the
// line carries.
func (c *conn) logRequest(req, ans wire.Message, conv uint64, start time.Time, sp trace.Span) {
	ev := c.log.Debug()
	if !ev.Enabled() {
		return
	}
	id, _ := wire.ID(req)
	ev = ev.Str("request", req.Type()).Uint64("id", id).Uint64("conversation", conv).Str("answer", ans.Type())
	if e, ok := ans.(*wire.Error); ok {
		ev = ev.Str("code", string(e.Code)).Str("detail", e.Detail)
	}
	withSpan(ev, sp).Dur("duration_ms", time.Since(start)).Msg("request")
}

// begin starts operation m on the service and returns the function that
// waits for it and builds its answer, and returns where its time went. Each operation is one case: the
// service request m makes, and the answer to its outcome. ctx is the
// server's operation context, carrying the request's span if traced.
func (c *conn) begin(ctx context.Context, m wire.Operation) func() (wire.Message, participant.Stages) {
	switch m := m.(type) {
	case *wire.Enroll:
		call := c.pc.StartEnroll(ctx, participant.Enroll{
			Conversation: participant.ConversationID(m.Conversation),
			Token:        participant.Token(m.Token),
			Invite:       m.Invite,
		})
		return answer(m.ID, call, func(id uint64, b participant.Bound) wire.Message {
			return &wire.Enrolled{
				ID: id, Conversation: uint64(b.Conversation), Participant: uint64(b.Participant),
				Generation: uint64(b.Generation), Secret: wire.Secret(b.Secret), Cursor: uint64(b.Cursor),
				ReceiptExpiresAt: unixMilli(b.ReceiptExpiresAt), Replay: replay(b.Replay),
			}
		})
	case *wire.Attach:
		call := c.pc.StartAttach(ctx, participant.Attach{
			Conversation: participant.ConversationID(m.Conversation),
			Participant:  participant.ParticipantID(m.Participant),
			Generation:   participant.Generation(m.Generation),
			Secret:       participant.Secret(m.Secret),
			Token:        participant.Token(m.Token),
		})
		return answer(m.ID, call, func(id uint64, b participant.Bound) wire.Message {
			return &wire.Attached{
				ID: id, Conversation: uint64(b.Conversation), Participant: uint64(b.Participant),
				Generation: uint64(b.Generation), Secret: wire.Secret(b.Secret), Cursor: uint64(b.Cursor),
				ReceiptExpiresAt: unixMilli(b.ReceiptExpiresAt), Replay: replay(b.Replay),
			}
		})
	case *wire.Tell:
		call := c.pc.StartTell(ctx, participant.Tell{
			Conversation: participant.ConversationID(m.Conversation),
			Participant:  participant.ParticipantID(m.Participant),
			Generation:   participant.Generation(m.Generation),
			Token:        participant.Token(m.Token),
			Payload:      m.Payload,
		})
		return answer(m.ID, call, func(id uint64, t participant.Told) wire.Message {
			return &wire.Told{ID: id, Conversation: uint64(t.Conversation), Seq: uint64(t.Seq), Replay: replay(t.Replay)}
		})
	case *wire.Ack:
		call := c.pc.StartAck(ctx, participant.Ack{
			Conversation: participant.ConversationID(m.Conversation),
			Participant:  participant.ParticipantID(m.Participant),
			Generation:   participant.Generation(m.Generation),
			Through:      participant.Seq(m.Through),
		})
		return answer(m.ID, call, func(id uint64, a participant.Acked) wire.Message {
			return &wire.Acked{ID: id, Conversation: uint64(a.Conversation), Participant: uint64(a.Participant), Cursor: uint64(a.Cursor), Noop: a.Noop}
		})
	case *wire.Detach:
		call := c.pc.StartDetach(ctx, participant.Detach{
			Conversation: participant.ConversationID(m.Conversation),
			Participant:  participant.ParticipantID(m.Participant),
			Generation:   participant.Generation(m.Generation),
			Token:        participant.Token(m.Token),
		})
		return answer(m.ID, call, func(id uint64, d participant.Ended) wire.Message {
			return &wire.Detached{ID: id, Conversation: uint64(d.Conversation), Participant: uint64(d.Participant), Seq: uint64(d.Seq), Replay: replay(d.Replay)}
		})
	case *wire.Leave:
		call := c.pc.StartLeave(ctx, participant.Leave{
			Conversation: participant.ConversationID(m.Conversation),
			Participant:  participant.ParticipantID(m.Participant),
			Generation:   participant.Generation(m.Generation),
			Secret:       participant.Secret(m.Secret),
			Token:        participant.Token(m.Token),
		})
		return answer(m.ID, call, func(id uint64, l participant.Ended) wire.Message {
			return &wire.Left{ID: id, Conversation: uint64(l.Conversation), Participant: uint64(l.Participant), Seq: uint64(l.Seq), Replay: replay(l.Replay)}
		})
	}
	panic("server: begin(" + m.Type() + ")")
}

// answer returns the function that waits for call, the operation of
// request id, and answers it: with ok's answer, or errorAnswer's; and
// with the call's stages.
func answer[A any](id uint64, call *participant.Call[A], ok func(id uint64, a A) wire.Message) func() (wire.Message, participant.Stages) {
	return func() (wire.Message, participant.Stages) {
		a, err := call.Wait()
		if err != nil {
			return errorAnswer(id, err), call.Stages()
		}
		return ok(id, a), call.Stages()
	}
}

// errorAnswer maps an operation's error onto the protocol's error answer,
// with the extras its code carries.
func errorAnswer(id uint64, err error) *wire.Error {
	var pe *participant.Error
	if !errors.As(err, &pe) {
		// Not a refusal the service classified: the operation may have
		// reached the store, so the only honest answer is in_doubt.
		return &wire.Error{ID: id, Code: wire.CodeInDoubt, Detail: "internal error"}
	}
	e := &wire.Error{ID: id, Code: wire.Code(pe.Code), Detail: pe.Detail}
	switch pe.Code {
	case participant.CodeStaleAuthority:
		if pe.HasGeneration {
			e.Generation = ptr(uint64(pe.Generation))
		}
	case participant.CodeAckGap, participant.CodeAckRegression:
		e.Cursor = ptr(uint64(pe.Cursor))
	case participant.CodeTooLarge, participant.CodeCapacityExceeded, participant.CodeBacklogFull, participant.CodeRateLimited:
		e.Limit = ptr(pe.Limit)
	case participant.CodeCompacted:
		e.First = ptr(uint64(pe.First))
	case participant.CodeMoved:
		if pe.Owner != "" {
			e.Owner = ptr(pe.Owner)
		}
	case participant.CodeReceiptExpired:
		e.Participant = ptr(uint64(pe.Participant))
		e.Generation = ptr(uint64(pe.Generation))
		e.Reason = ptr(pe.Reason)
	case participant.CodeTokenExpired:
		e.Oldest = ptr(uint64(max(pe.Oldest, 0)))
	case participant.CodeTokenInvalid:
		// Newest is set only when the token was a UUIDv7 ahead of the
		// clock; a token that is not one gets no bound to aim at.
		if pe.Newest > 0 {
			e.Newest = ptr(uint64(pe.Newest))
		}
	}
	return e
}

func ptr[T any](v T) *T { return &v }

func replay(r participant.Replay) *wire.Replay {
	if r == participant.ReplayNone {
		return nil
	}
	return ptr(wire.Replay(r))
}

func unixMilli(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMilli())
}
