package participant

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (Options.TracerProvider). A batch serves many requests, often
// of several connections, so its span is not any one request's child: it
// starts a trace of its own and links to the span of every request it
// carries (the OpenTelemetry specification's answer to fan-in). Its
// barriers are its children:
//
//	participantd.batch            links → each carried request's span
//	├── participantd.barrier.oplog    barrier 1: the oplog flush
//	└── participantd.barrier.outbox   barrier 2: the outbox flush
//
// or, on a store that keeps a conversation's writes in order ("One sync
// for both barriers" in docs/DESIGN.md), one participantd.barrier.sync
// that keeps both. With no TracerProvider the service holds no tracer and
// every tracing step is one nil check: nothing is allocated.
const (
	SpanBatch         = "participantd.batch"
	SpanOplogBarrier  = "participantd.barrier.oplog"
	SpanOutboxBarrier = "participantd.barrier.outbox"
	SpanSharedSync    = "participantd.barrier.sync"
)

// Span attribute keys of the service's spans.
const (
	AttrConversation = attribute.Key("participantd.conversation")
	AttrOperations   = attribute.Key("participantd.operations")
	AttrStaged       = attribute.Key("participantd.staged")
	AttrErrorCode    = attribute.Key("participantd.error.code")
)

const tracerName = "github.com/participantd/participantd/participant"

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(tracerName)
}

// requestSpan is the span of the request ctx carries, which a batch's
// span links to; the zero SpanContext when tracing is off.
func (s *Service) requestSpan(ctx context.Context) trace.SpanContext {
	if s.tracer == nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(ctx)
}

// startBatch starts b's span, linked to the spans of the requests of
// tasks; tracing is on.
func (b *batch) startBatch(tasks []*task) {
	links := make([]trace.Link, 0, len(tasks))
	for _, t := range tasks {
		if t.link.IsValid() {
			links = append(links, trace.Link{SpanContext: t.link})
		}
	}
	_, b.span = b.s.tracer.Start(b.s.ctx, SpanBatch,
		trace.WithLinks(links...),
		trace.WithAttributes(AttrConversation.Int64(int64(b.cv.id)), AttrOperations.Int(len(tasks))))
}

// endBatch ends b's span, if traced, with the outcome of its writes.
func (b *batch) endBatch(werr error) {
	if b.span == nil {
		return
	}
	b.span.SetAttributes(AttrStaged.Int(len(b.ops)))
	endSpan(b.span, werr)
}

// startBarrier starts the span of one of b's barriers, or returns nil if
// b is not traced.
func (b *batch) startBarrier(name string) trace.Span {
	if b.span == nil {
		return nil
	}
	_, sp := b.s.tracer.Start(trace.ContextWithSpan(b.s.ctx, b.span), name)
	return sp
}

// endSpan ends sp (nil: not traced) with err's outcome: an error status
// and, for an *Error, its protocol code.
func endSpan(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			sp.SetAttributes(AttrErrorCode.String(string(e.Code)))
		}
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
