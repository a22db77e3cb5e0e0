package server_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

func recorder(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

// requestSpan returns the ended request span of request id.
func requestSpan(t *testing.T, spans []sdktrace.ReadOnlySpan, id uint64) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if s.Name() == server.SpanRequest && spanAttr(s, server.AttrRequestID).AsInt64() == int64(id) {
			return s
		}
	}
	t.Fatalf("no %s span of request %d", server.SpanRequest, id)
	return nil
}

// TestTrace_ATellIsARequestSpanLinkedFromItsBatch tells through a real
// server with tracing on: the tell is a request span with its kind,
// conversation, participant and answer; its answer span is its child; the
// batch that committed it links to it and parents the barrier (one shared
// sync: the log-first store keeps order); and the request's log line
// carries the request span's trace and span ids.
func TestTrace_ATellIsARequestSpanLinkedFromItsBatch(t *testing.T) {
	rec, tp := recorder(t)
	var logs lockedBuffer
	h := start(t, server.Config{TracerProvider: tp, Logger: zerolog.New(&logs).Level(zerolog.DebugLevel)})
	c := h.dial()
	cr := c.enroll(9)
	id := c.id()
	if a, ok := c.call(&wire.Tell{ID: id, Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte("x")}).(*wire.Told); !ok {
		t.Fatalf("tell answered %#v", a)
	}
	h.shutdown()
	spans := rec.Ended()
	req := requestSpan(t, spans, id)
	for k, want := range map[attribute.Key]any{
		server.AttrRequest:           "tell",
		participant.AttrConversation: int64(9),
		server.AttrParticipant:       int64(cr.p),
		server.AttrAnswer:            "told",
		participant.AttrErrorCode:    "", // none: not refused
	} {
		v := spanAttr(req, k)
		var got any = v.AsString()
		if _, isInt := want.(int64); isInt {
			got = v.AsInt64()
		}
		if got != want {
			t.Errorf("request span %s = %v, want %v", k, got, want)
		}
	}
	if req.Status().Code == codes.Error {
		t.Errorf("request span status = %v, want not an error", req.Status())
	}
	var answer, batch sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == server.SpanAnswer && s.Parent().SpanID() == req.SpanContext().SpanID() {
			answer = s
		}
		if s.Name() == participant.SpanBatch {
			for _, l := range s.Links() {
				if l.SpanContext.SpanID() == req.SpanContext().SpanID() {
					batch = s
				}
			}
		}
	}
	if answer == nil || !spanAttr(answer, server.AttrQueued).AsBool() {
		t.Errorf("answer span under the request = %v, want one, queued", answer)
	}
	if batch == nil {
		t.Fatal("no batch span links to the tell's request span")
	}
	var barriers []string
	for _, s := range spans {
		if s.Parent().SpanID() == batch.SpanContext().SpanID() {
			barriers = append(barriers, s.Name())
		}
	}
	if diff := cmp.Diff([]string{participant.SpanSharedSync}, barriers); diff != "" {
		t.Errorf("the batch's barrier spans (-want +got):\n%s", diff)
	}
	found := false
	for _, l := range logs.lines() {
		if l["message"] == "request" && l["request"] == "tell" {
			found = true
			if l["trace_id"] != req.SpanContext().TraceID().String() || l["span_id"] != req.SpanContext().SpanID().String() {
				t.Errorf("tell's log line trace_id=%v span_id=%v, want %v %v", l["trace_id"], l["span_id"], req.SpanContext().TraceID(), req.SpanContext().SpanID())
			}
		}
	}
	if !found {
		t.Error("no request log line for the tell")
	}
}

// TestTrace_ARefusedRequestRecordsItsCode: a tell with a stale generation
// is refused stale_authority; its request span says so, as an error.
func TestTrace_ARefusedRequestRecordsItsCode(t *testing.T) {
	rec, tp := recorder(t)
	h := start(t, server.Config{TracerProvider: tp})
	c := h.dial()
	cr := c.enroll(4)
	id := c.id()
	a := c.call(&wire.Tell{ID: id, Conversation: cr.conv, Participant: cr.p, Generation: cr.gen + 1, Token: token(), Payload: []byte("x")})
	e, ok := a.(*wire.Error)
	if !ok {
		t.Fatalf("tell with a wrong generation answered %#v, want an error", a)
	}
	h.shutdown()
	req := requestSpan(t, rec.Ended(), id)
	if got := spanAttr(req, participant.AttrErrorCode).AsString(); got != string(e.Code) {
		t.Errorf("request span %s = %q, want %q", participant.AttrErrorCode, got, e.Code)
	}
	if got := spanAttr(req, server.AttrAnswer).AsString(); got != "error" {
		t.Errorf("request span %s = %q, want error", server.AttrAnswer, got)
	}
	if req.Status().Code != codes.Error {
		t.Errorf("request span status = %v, want an error", req.Status())
	}
}

// TestTrace_OffRecordsNothingAndAnswersTheSame runs one exchange with
// tracing off, while the process's global TracerProvider records (so a
// stray use of the global would show), and again with tracing on: off
// records no span, and both answer the same.
func TestTrace_OffRecordsNothingAndAnswersTheSame(t *testing.T) {
	global, gtp := recorder(t)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(gtp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	exchange := func(cfg server.Config) []string {
		h := start(t, cfg)
		c := h.dial()
		cr := c.enroll(2)
		first := c.tell(cr, "a")
		refused, _ := c.call(&wire.Tell{ID: c.id(), Conversation: 2, Participant: cr.p, Generation: cr.gen + 1, Token: token()}).(*wire.Error)
		if refused == nil {
			t.Fatal("a tell with a wrong generation was not refused")
		}
		answers := []string{
			fmt.Sprintf("seq %d", first.Seq),
			string(refused.Code) + ": " + refused.Detail,
			fmt.Sprintf("seq %d", c.tell(cr, "b").Seq),
		}
		h.shutdown()
		return answers
	}
	off := exchange(server.Config{})
	if n := len(global.Ended()) + len(global.Started()); n != 0 {
		t.Errorf("tracing off: %d spans on the global provider, want 0", n)
	}
	rec, tp := recorder(t)
	on := exchange(server.Config{TracerProvider: tp})
	if diff := cmp.Diff(off, on); diff != "" {
		t.Errorf("answers off vs on (-off +on):\n%s", diff)
	}
	if len(rec.Ended()) == 0 {
		t.Error("tracing on recorded no span")
	}
}
