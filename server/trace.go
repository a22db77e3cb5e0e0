package server

import (
	"context"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// Tracing (Config.TracerProvider). Each request a connection sends is one
// span, the parent of the span of its answer:
//
//	participantd.request              kind, id, conversation, participant,
//	│                                 answer, error code
//	└── participantd.answer           the answer encoded and queued to the
//	                                  connection's writer
//	participantd.batch                links → the request spans it carries
//	├── participantd.barrier.oplog    (participant/trace.go)
//	└── participantd.barrier.outbox
//
// The request's context carries its span into the service, whose batch
// links to it (a batch commits many requests, so it is no one's child).
// With tracing off the server holds no tracer: no span, no context, no
// allocation.
const (
	SpanRequest = "participantd.request"
	SpanAnswer  = "participantd.answer"
)

// Span attribute keys of the server's spans; the conversation and error
// code keys are the service's (participant.AttrConversation, AttrErrorCode).
const (
	AttrRequest     = attribute.Key("participantd.request")
	AttrRequestID   = attribute.Key("participantd.request.id")
	AttrParticipant = attribute.Key("participantd.participant")
	AttrAnswer      = attribute.Key("participantd.answer")
	AttrQueued      = attribute.Key("participantd.answer.queued")
)

const tracerName = "github.com/participantd/participantd/server"

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracerName)
}

// startRequest starts the span of request m of conversation conv and
// returns the context that carries it into the service; tracing is on.
func (c *conn) startRequest(conv uint64, m wire.Operation) (context.Context, trace.Span) {
	id, _ := wire.ID(m)
	attrs := []attribute.KeyValue{
		AttrRequest.String(m.Type()),
		AttrRequestID.Int64(int64(id)),
		participant.AttrConversation.Int64(int64(conv)),
	}
	if p, ok := participantOf(m); ok {
		attrs = append(attrs, AttrParticipant.Int64(int64(p)))
	}
	return c.srv.tracer.Start(c.srv.opCtx, SpanRequest,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// sendTraced ends sp, the span of a request answered with a, and sends
// a under its child span; it returns whether the writer took a.
func (c *conn) sendTraced(sp trace.Span, a wire.Message) bool {
	sp.SetAttributes(AttrAnswer.String(a.Type()))
	switch a := a.(type) {
	case *wire.Enrolled:
		sp.SetAttributes(AttrParticipant.Int64(int64(a.Participant)))
	case *wire.Error:
		sp.SetAttributes(participant.AttrErrorCode.String(string(a.Code)))
		sp.SetStatus(codes.Error, string(a.Code)+": "+a.Detail)
	}
	sent := false
	if !c.abandon.Load() {
		_, asp := c.srv.tracer.Start(trace.ContextWithSpan(c.srv.opCtx, sp), SpanAnswer)
		sent = c.out.send(a)
		asp.SetAttributes(AttrQueued.Bool(sent))
		asp.End()
	}
	sp.End()
	return sent
}

// participantOf returns the participant request m names, if it names one
// (an enroll's is known only from its answer).
func participantOf(m wire.Operation) (uint64, bool) {
	switch m := m.(type) {
	case *wire.Attach:
		return m.Participant, true
	case *wire.Tell:
		return m.Participant, true
	case *wire.Ack:
		return m.Participant, true
	case *wire.Detach:
		return m.Participant, true
	case *wire.Leave:
		return m.Participant, true
	}
	return 0, false
}

// withSpan adds sp's trace and span ids to a log event; sp nil adds
// nothing.
func withSpan(ev *zerolog.Event, sp trace.Span) *zerolog.Event {
	if sp == nil {
		return ev
	}
	sc := sp.SpanContext()
	if !sc.IsValid() {
		return ev
	}
	return ev.Stringer("trace_id", sc.TraceID()).Stringer("span_id", sc.SpanID())
}
