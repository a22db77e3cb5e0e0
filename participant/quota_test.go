package participant

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
)

func wantCapacity(t *testing.T, what string, err error, limit uint64) {
	t.Helper()
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded || pe.Limit != limit {
		t.Fatalf("%s = %v, want capacity_exceeded with limit %d", what, err, limit)
	}
}

// MaxConversations caps the conversations of the store, across restarts;
// enrolls into existing conversations go on.
func TestMaxConversations(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, MaxConversations: 2}
	svc, err := Open(ctx, mem, opts)
	if err != nil {
		t.Fatal(err)
	}
	for conv := range ConversationID(2) {
		if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: conv + 1, Token: token(byte(conv + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 3, Token: token(3)})
	wantCapacity(t, "Enroll into a third conversation", err, 2)
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(4)}); err != nil {
		t.Fatalf("Enroll into an existing conversation at the cap = %v", err)
	}
	svc.Close()

	svc, err = Open(ctx, mem, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 3, Token: token(5)})
	wantCapacity(t, "Enroll into a third conversation after a restart", err, 2)
}

// Concurrent first enrolls of different conversations cannot overshoot
// the cap: the slot is taken when the enroll is decided.
func TestMaxConversations_Concurrent(t *testing.T) {
	ctx := context.Background()
	const max, tries = 5, 40
	svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, MaxConversations: max})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() {
			_, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: ConversationID(100 + i), Token: token(byte(i + 1))})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, &Error{Code: CodeCapacityExceeded}):
				refused.Add(1)
			default:
				t.Errorf("Enroll = %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != max || refused.Load() != tries-max {
		t.Fatalf("%d enrolls committed and %d refused, want %d and %d", ok.Load(), refused.Load(), max, tries-max)
	}
}

// A first enroll whose commit fails before its conversation is registered
// gives its slot back.
func TestMaxConversations_FailedCommitReleasesTheSlot(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	svc, err := Open(ctx, fs, Options{NodeKey: testKey, MaxConversations: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	fs.SetRules(faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(registry.Stream))))
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(1)}); !errors.Is(err, &Error{Code: CodeUnavailable}) {
		t.Fatalf("Enroll with a failing registry append = %v, want unavailable", err)
	}
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 2, Token: token(2)}); err != nil {
		t.Fatalf("Enroll after the failed one = %v, want its slot free", err)
	}
}

// Once the store's size reaches MaxDataBytes, enroll and tell are
// capacity_exceeded, while ack and detach still commit.
func TestMaxDataBytes(t *testing.T) {
	ctx := context.Background()
	var size atomic.Int64
	svc, err := Open(ctx, store.NewMemory(), Options{NodeKey: testKey, MaxDataBytes: 1000, DataBytes: size.Load})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	a, b := svc.Connect(nil), svc.Connect(nil)
	ba, err := a.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	bb, err := b.Enroll(ctx, Enroll{Conversation: 1, Token: token(2)})
	if err != nil {
		t.Fatal(err)
	}
	size.Store(1000)
	_, err = a.Tell(ctx, Tell{Conversation: 1, Participant: ba.Participant, Generation: 1, Token: token(3), Payload: []byte("x")})
	wantCapacity(t, "Tell at the data cap", err, 1000)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: token(4)})
	wantCapacity(t, "Enroll at the data cap", err, 1000)
	if _, err := a.Ack(ctx, Ack{Conversation: 1, Participant: ba.Participant, Generation: 1, Through: 2}); err != nil {
		t.Fatalf("Ack at the data cap = %v", err)
	}
	if _, err := b.Detach(ctx, Detach{Conversation: 1, Participant: bb.Participant, Generation: 1, Token: token(5)}); err != nil {
		t.Fatalf("Detach at the data cap = %v", err)
	}
	size.Store(999)
	if _, err := a.Tell(ctx, Tell{Conversation: 1, Participant: ba.Participant, Generation: 1, Token: token(6), Payload: []byte("x")}); err != nil {
		t.Fatalf("Tell below the data cap = %v", err)
	}
}

// TestRefusedFirstEnrollGivesBackItsBindingSlot: an enroll refused
// capacity_exceeded because the server holds MaxConversations gives back
// the binding slot it reserved on its connection, so refusals do not lock
// the connection out of enrolling.
func TestRefusedFirstEnrollGivesBackItsBindingSlot(t *testing.T) {
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, MaxConversations: 1, MaxConversationsPerConn: 2})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	c := svc.Connect(nil)
	b := mustEnroll(t, c, 1, 1)
	for i := range 3 {
		_, err := c.Enroll(ctx, Enroll{Conversation: ConversationID(2 + i), Token: token(byte(10 + i))})
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded || pe.Limit != 1 {
			t.Fatalf("Enroll into conversation %d past MaxConversations = %v, want capacity_exceeded limit 1", 2+i, err)
		}
	}
	if _, err := c.Detach(ctx, Detach{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(20)}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: token(21)}); err != nil {
		t.Errorf("Enroll after the refusals, with the connection holding no binding = %v, want ok", err)
	}
}
