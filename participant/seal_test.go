package participant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/participantd/participantd/store"
)

// sealRecorder is a store that does not keep its writes' order but seals
// (store.Sealer): it records the appends, seals, flushes and waits, and
// can make the next seal's wait fail after the inner flush (the sealed
// commit failed while the outbox rows were appended).
type sealRecorder struct {
	store.DurableStore // the method set of the interface only: not Ordered

	// mu guards calls and failWait.
	mu sync.Mutex
	// calls are the recorded calls, in order.
	// +checklocks:mu
	calls []string
	// failWait, when set, is what the next seal's wait returns.
	// +checklocks:mu
	failWait error
}

func (r *sealRecorder) record(call string) {
	r.mu.Lock()
	r.calls = append(r.calls, call)
	r.mu.Unlock()
}

func (r *sealRecorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := strings.Join(r.calls, ", ")
	r.calls = nil
	return got
}

func (r *sealRecorder) Append(stream string, payload []byte, expectedSeq uint64) (uint64, error) {
	r.record(fmt.Sprintf("append %s", stream))
	return r.DurableStore.Append(stream, payload, expectedSeq)
}

func (r *sealRecorder) Flush() error {
	r.record("flush")
	return r.DurableStore.Flush()
}

func (r *sealRecorder) Seal() (func() error, error) {
	r.record("seal")
	r.mu.Lock()
	fail := r.failWait
	r.failWait = nil
	r.mu.Unlock()
	return func() error {
		r.record("sealed durable")
		if fail != nil {
			return fail
		}
		return r.DurableStore.Flush()
	}, nil
}

// sealedConversation opens a service over a sealRecorder and enrolls two
// participants into conversation 7: the sender's connection and binding
// are returned.
func sealedConversation(t *testing.T) (*sealRecorder, *Conn, Bound) {
	t.Helper()
	ctx := context.Background()
	rec := &sealRecorder{DurableStore: store.NewMemory()}
	svc := openService(t, rec)
	sender := svc.Connect(nil)
	a, err := sender.Enroll(ctx, Enroll{Conversation: 7, Token: token(1)})
	must(t, err)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 7, Token: token(2)})
	must(t, err)
	return rec, sender, a
}

// TestBatch_TheOutboxRowsAreAppendedOnceTheOplogRowsAreSealed records the
// store calls of a tell's commit over a store that seals (store.Sealer)
// and does not keep its writes' order: the oplog rows are sealed, the
// outbox rows appended and flushed without waiting for them, and the
// seal's wait comes last, before the answer. Over a store that flushed
// per barrier the calls were: oplog append, flush, outbox append, flush.
func TestBatch_TheOutboxRowsAreAppendedOnceTheOplogRowsAreSealed(t *testing.T) {
	ctx := context.Background()
	rec, sender, a := sealedConversation(t)
	const conv = 7
	rec.take()
	if _, err := sender.Tell(ctx, Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: token(3), Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	want := "append oplog/7, seal, append outbox/7, flush, sealed durable"
	if got := rec.take(); got != want {
		t.Fatalf("a tell's store calls = %q, want %q", got, want)
	}
}

// TestBatch_ASealedCommitThatFailsIsInDoubt fails the sealed oplog commit
// after the outbox rows were appended and flushed (what a store reports
// when the record carrying the oplog rows fails while the batch went
// on): the tell is answered in_doubt, as an oplog flush that fails, not
// told; the conversation is reconciled from what the store holds, and the
// retry with the same token replays the seq the rows carry.
func TestBatch_ASealedCommitThatFailsIsInDoubt(t *testing.T) {
	ctx := context.Background()
	rec, sender, a := sealedConversation(t)
	const conv = 7
	injected := errors.New("injected: the sealed record failed")
	rec.mu.Lock()
	rec.failWait = injected
	rec.mu.Unlock()
	tell := Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: token(3), Payload: []byte("x")}
	_, err := sender.Tell(ctx, tell)
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeInDoubt || pe.Detail != "oplog flush" || !errors.Is(err, injected) {
		t.Fatalf("Tell whose sealed commit failed = %v, want in_doubt (oplog flush) wrapping the failure", err)
	}
	again, err := sender.Tell(ctx, tell)
	if err != nil || again.Replay != ReplayCommitted {
		t.Fatalf("retry = %+v, %v; want a replay of the rows the store holds", again, err)
	}
}
