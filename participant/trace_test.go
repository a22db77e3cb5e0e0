package participant

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// tracedService opens a service over fs whose spans rec records.
func tracedService(t *testing.T, fs store.DurableStore) (*Service, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	svc, err := Open(context.Background(), fs, Options{NodeKey: testKey, TracerProvider: tp})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { svc.Close() })
	return svc, rec, tp.Tracer("request")
}

// spanNamed returns the one ended span named name among spans.
func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %s, want 1", len(found), name)
	}
	return found[0]
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestTrace_BatchLinksTheRequestAndParentsItsBarriers tells under a
// request span, over a store that keeps order (one shared sync) and one
// that does not (a flush per barrier): the batch's span links to the
// request's span and is the parent of its barriers' spans, in the order
// the barriers run.
func TestTrace_BatchLinksTheRequestAndParentsItsBarriers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		unordered bool
		barriers  []string
	}{
		{"ordered", false, []string{SpanSharedSync}},
		{"unordered", true, []string{SpanOplogBarrier, SpanOutboxBarrier}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := faultstore.New(store.NewMemory())
			fs.SetUnordered(tc.unordered)
			svc, rec, tracer := tracedService(t, fs)
			const conv = 7
			c := svc.Connect(nil)
			b, err := c.Enroll(context.Background(), Enroll{Conversation: conv, Token: token(1)})
			if err != nil {
				t.Fatal(err)
			}
			rec.Reset()
			ctx, req := tracer.Start(context.Background(), "request")
			if _, err := c.Tell(ctx, Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Token: token(2), Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			req.End()
			spans := rec.Ended()
			batch := spanNamed(t, spans, SpanBatch)
			if l := batch.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != req.SpanContext().SpanID() || l[0].SpanContext.TraceID() != req.SpanContext().TraceID() {
				t.Errorf("batch links = %+v, want one to the request span %v", l, req.SpanContext().SpanID())
			}
			if v, _ := attrOf(batch, AttrConversation); v.AsInt64() != conv {
				t.Errorf("batch %s = %v, want %d", AttrConversation, v.AsInt64(), conv)
			}
			if v, _ := attrOf(batch, AttrStaged); v.AsInt64() != 1 {
				t.Errorf("batch %s = %v, want 1", AttrStaged, v.AsInt64())
			}
			if batch.Status().Code == codes.Error {
				t.Errorf("batch status = %v, want not an error", batch.Status())
			}
			var got []string
			for _, s := range spans {
				if s.Parent().SpanID() == batch.SpanContext().SpanID() {
					got = append(got, s.Name())
				}
			}
			if len(got) != len(tc.barriers) {
				t.Fatalf("batch children = %v, want %v", got, tc.barriers)
			}
			for i := range got {
				if got[i] != tc.barriers[i] {
					t.Fatalf("batch children = %v, want %v", got, tc.barriers)
				}
			}
		})
	}
}

// TestTrace_AFailedBarrierRecordsInDoubt fails the outbox flush of a
// tell: the barrier's span and the batch's span carry the error, the
// batch's with the code the request is answered (in_doubt).
func TestTrace_AFailedBarrierRecordsInDoubt(t *testing.T) {
	fs := faultstore.New(store.NewMemory())
	fs.SetUnordered(true)
	svc, rec, _ := tracedService(t, fs)
	c := svc.Connect(nil)
	b, err := c.Enroll(context.Background(), Enroll{Conversation: 3, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	// Barrier 2's flush is the one with outbox rows pending.
	fs.SetRules(faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(outbox.StreamPrefix))))
	_, err = c.Tell(context.Background(), Tell{Conversation: 3, Participant: b.Participant, Generation: b.Generation, Token: token(2), Payload: []byte("x")})
	if !errors.Is(err, ErrInDoubt) {
		t.Fatalf("Tell = %v, want in_doubt", err)
	}
	spans := rec.Ended()
	for _, name := range []string{SpanBatch, SpanOutboxBarrier} {
		s := spanNamed(t, spans, name)
		if s.Status().Code != codes.Error {
			t.Errorf("%s status = %v, want an error", name, s.Status())
		}
	}
	if v, _ := attrOf(spanNamed(t, spans, SpanBatch), AttrErrorCode); v.AsString() != string(CodeInDoubt) {
		t.Errorf("batch %s = %q, want %q", AttrErrorCode, v.AsString(), CodeInDoubt)
	}
	if s := spanNamed(t, spans, SpanOplogBarrier); s.Status().Code == codes.Error {
		t.Errorf("%s status = %v, want not an error", SpanOplogBarrier, s.Status())
	}
}

// TestTrace_OneBatchLinksEveryRequestItCarries queues tells of n request
// spans behind a held turn so that they commit as one batch: one batch
// span, linked to each of the n request spans (fan-in by links, not by
// parentage).
func TestTrace_OneBatchLinksEveryRequestItCarries(t *testing.T) {
	svc, rec, tracer := tracedService(t, store.NewMemory())
	c := svc.Connect(nil)
	b, err := c.Enroll(context.Background(), Enroll{Conversation: 1, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	cv := svc.existing(1)
	if err := cv.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	const n = 4
	want := map[trace.SpanID]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		ctx, req := tracer.Start(context.Background(), "request")
		want[req.SpanContext().SpanID()] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer req.End()
			_, err := c.Tell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(byte(10 + i)), Payload: []byte{byte(i)}})
			errs <- err
		}()
	}
	waitQueued(t, cv, n)
	svc.release(cv)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	batch := spanNamed(t, rec.Ended(), SpanBatch)
	got := map[trace.SpanID]bool{}
	for _, l := range batch.Links() {
		got[l.SpanContext.SpanID()] = true
	}
	if len(got) != n || len(batch.Links()) != n {
		t.Fatalf("batch links %d distinct of %d, want the %d request spans", len(got), len(batch.Links()), n)
	}
	for id := range want {
		if !got[id] {
			t.Errorf("batch does not link request span %v", id)
		}
	}
	if v, _ := attrOf(batch, AttrOperations); v.AsInt64() != n {
		t.Errorf("batch %s = %d, want %d", AttrOperations, v.AsInt64(), n)
	}
}

// TestTrace_OffRecordsNoLink: without a TracerProvider a tell under a
// request span leaves the service tracer-less, and the request's context
// gains nothing (the task's link stays invalid).
func TestTrace_OffRecordsNoLink(t *testing.T) {
	svc := openService(t, store.NewMemory())
	if svc.tracer != nil {
		t.Fatal("service without a TracerProvider has a tracer")
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, req := tp.Tracer("request").Start(context.Background(), "request")
	if sc := svc.requestSpan(ctx); sc.IsValid() {
		t.Errorf("requestSpan with tracing off = %v, want invalid", sc)
	}
	c := svc.Connect(nil)
	if _, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)}); err != nil {
		t.Fatal(err)
	}
	req.End()
	if spans := rec.Ended(); len(spans) != 1 {
		t.Errorf("%d spans ended, want only the test's request span", len(spans))
	}
}

// TestTrace_OffAllocatesNothing runs every tracing step of a request and
// a batch with tracing off: none allocates.
func TestTrace_OffAllocatesNothing(t *testing.T) {
	svc := openService(t, store.NewMemory())
	b := &batch{s: svc}
	ctx := context.Background()
	werr := refuse(CodeInDoubt, "x")
	if n := testing.AllocsPerRun(100, func() {
		_ = svc.requestSpan(ctx)
		sp := b.startBarrier(SpanOplogBarrier)
		endSpan(sp, werr)
		b.endBatch(werr)
	}); n != 0 {
		t.Errorf("tracing off: %v allocations per request and batch, want 0", n)
	}
}
