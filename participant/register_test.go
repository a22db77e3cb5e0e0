package participant

import (
	"context"
	"testing"

	"github.com/participantd/participantd/store"
)

// TestEnrollIntoANewConversationFlushesTwice: the registry entry rides
// barrier 1 with the genesis row (the store keeps a prefix of writes, so
// the row is never durable without it), so a first enroll costs the two
// barriers of any operation, not a third flush of its own.
func TestEnrollIntoANewConversationFlushesTwice(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	cs := &countingStore{DurableStore: mem}
	svc := openService(t, cs)
	c := svc.Connect(nil)
	for conv := ConversationID(1); conv <= 3; conv++ {
		cs.mu.Lock()
		before := cs.flushes
		cs.mu.Unlock()
		if _, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: token(byte(conv))}); err != nil {
			t.Fatalf("Enroll(%v): %v", conv, err)
		}
		cs.mu.Lock()
		flushes := cs.flushes - before
		cs.mu.Unlock()
		if flushes != 2 {
			t.Fatalf("Enroll into new conversation %v made %d flushes, want 2", conv, flushes)
		}
	}
	// The registry holds each conversation once, durably.
	mem.Crash()
	regs, err := readRegistry(mem)
	if err != nil {
		t.Fatalf("readRegistry: %v", err)
	}
	if len(regs) != 3 {
		t.Fatalf("registry after a crash = %v, want 3 conversations", regs)
	}
}
