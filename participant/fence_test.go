package participant

import (
	"context"
	"sync"
	"testing"

	"github.com/participantd/participantd/store"
)

// forgetOnRead calls forget once, on the first token index read after it is
// armed: in the middle of a batch, after the turn's holder loaded the
// conversation and before it decides, as a keep-alive that notices a lost
// ownership would.
type forgetOnRead struct {
	store.DurableStore
	mu sync.Mutex
	// +checklocks:mu
	forget func()
}

func (s *forgetOnRead) arm(forget func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget = forget
}

func (s *forgetOnRead) ReadValue(key string) (uint64, error) {
	s.mu.Lock()
	forget := s.forget
	s.forget = nil
	s.mu.Unlock()
	if forget != nil {
		forget()
	}
	return s.DurableStore.ReadValue(key)
}

// TestFence_ForgetOvertakesBatch_EndingRefused: Forget does not wait for the
// turn, so a batch can decide against a conversation forgotten under it.
// The turn cannot refuse that batch's ending of a binding; the fence does:
// Forget took the binding's token with it, so the ending is refused before
// anything is written (unavailable: definitely not applied), and the binding
// is still there, and still endable, once the conversation is reloaded.
func TestFence_ForgetOvertakesBatch_EndingRefused(t *testing.T) {
	ctx := context.Background()
	st := &forgetOnRead{DurableStore: store.NewMemory()}
	svc := openService(t, st)
	c := svc.Connect(nil)
	b := mustEnroll(t, c, 1, 1)
	before := oplogLen(t, st, 1)

	st.arm(func() { svc.Forget(1) })
	detach := Detach{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(2)}
	_, err := c.Detach(ctx, detach)
	if pe := codeOf(err); pe == nil || pe.Code != CodeUnavailable {
		t.Fatalf("Detach overtaken by Forget = %v, want unavailable", err)
	}
	if got := oplogLen(t, st, 1); got != before {
		t.Fatalf("oplog length after the refused detach = %d, want %d (nothing written)", got, before)
	}

	if _, err := c.Detach(ctx, detach); err != nil {
		t.Fatalf("Detach after the reload = %v, want the binding ended", err)
	}
	if got := oplogLen(t, st, 1); got != before+1 {
		t.Fatalf("oplog length after the detach = %d, want %d", got, before+1)
	}
}
