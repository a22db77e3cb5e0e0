package server

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// submit queues m, whose frame holds held bytes of the pending budgets
// (reserve took them before its body was read; the request gives them
// back once answered), behind the earlier requests of conversation conv,
// starting that conversation's worker if it has none. It blocks while
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
	q, running := c.queues[conv]
	c.queues[conv] = append(q, request{m: m, held: held, read: read})
	c.mu.Unlock()
	if !running {
		c.workers.Add(1)
		c.srv.work.run(func() { c.work(conv) })
	}
	return true
}

// work runs conversation conv's requests in order until its queue is
// empty. It starts every request queued so far on the service before
// waiting for the first: the service decides them in the order started and
// commits those queued together behind one pair of barriers, and their
// answers are sent in that same order.
func (c *conn) work(conv uint64) {
	defer c.workers.Done()
	for {
		c.mu.Lock()
		q := c.queues[conv]
		if len(q) == 0 {
			delete(c.queues, conv)
			c.mu.Unlock()
			return
		}
		// Keep the key: it marks the worker as running.
		c.queues[conv] = nil
		c.mu.Unlock()
		answers := make([]func() (wire.Message, participant.Stages), len(q))
		// spans are the requests' spans when tracing is on (trace.go).
		var spans []trace.Span
		if c.srv.tracer != nil {
			spans = make([]trace.Span, len(q))
		}
		start := time.Now()
		for i, r := range q {
			ctx := c.srv.opCtx
			if spans != nil {
				ctx, spans[i] = c.startRequest(conv, r.m)
			}
			answers[i] = c.begin(ctx, r.m)
		}
		held := false
		for i, answer := range answers {
			a, st := answer() // always waited for: the service counts it in flight
			now := c.touch()
			op := opIndex(q[i].m)
			c.srv.metrics.stages.answered(op, q[i].read, start, now, st)
			if !held {
				// The requests queued together are decided in one batch
				// (unless another batch took the queue between two of
				// them): once the first is answered the others are too,
				// and their answers are queued under one hold.
				c.out.hold()
				held = true
			}
			var sp trace.Span
			if spans != nil {
				sp, spans[i] = spans[i], nil
			}
			c.logRequest(q[i].m, a, conv, start, sp)
			switch {
			case sp != nil:
				c.sendTraced(sp, a)
			case !c.abandon.Load():
				c.out.sendHeldTimed(a, timing{stages: &c.srv.metrics.stages.by[op], read: q[i].read, queued: now})
			}
			c.release(q[i].held)
			q[i], answers[i] = request{}, nil // let the request's bytes go
			<-c.pending
		}
		if held {
			// The batch that answered these published its deliveries
			// before it completed them: when the pump has some to send,
			// the answers wait for them and leave in the same write.
			c.out.release(!c.pc.HasReady())
		}
	}
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
