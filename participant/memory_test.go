package participant

import (
	"context"
	"crypto/rand"
	"errors"
	"runtime"
	"testing"

	"github.com/participantd/participantd/store"
)

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestRefusedEnrollsDoNotGrowMemory refuses many enrolls into conversations
// that do not exist (capacity_exceeded: the connection is at its cap) and
// checks that the heap does not grow with them: a refused enroll leaves no
// conversation entry behind.
func TestRefusedEnrollsDoNotGrowMemory(t *testing.T) {
	const n = 20000
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, MaxConversationsPerConn: 1})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	c := svc.Connect(nil)
	mustEnroll(t, c, 1, 1)
	ctx := context.Background()
	refuseOne := func(conv ConversationID) {
		var tok Token
		rand.Read(tok[:])
		_, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: tok})
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != CodeCapacityExceeded {
			t.Fatalf("Enroll(conversation %v) on a full connection = %v, want capacity_exceeded", conv, err)
		}
	}
	// Warm up, so that lazily built structures are not counted.
	for i := range 100 {
		refuseOne(ConversationID(1_000_000 + i))
	}
	before := heapInUse()
	for i := range n {
		refuseOne(ConversationID(2 + i))
	}
	after := heapInUse()
	// Each leaked entry costs about 1 KiB, so a leak shows as ~20 MiB; the
	// bound leaves room for noise.
	const bound = 2 << 20
	if after > before && after-before > bound {
		t.Errorf("%d refused enrolls grew the heap by %d bytes, want < %d", n, after-before, bound)
	}
	svc.mu.Lock()
	entries := len(svc.convs)
	svc.mu.Unlock()
	if entries != 1 {
		t.Errorf("after %d refused enrolls the service holds %d conversation entries, want 1", n, entries)
	}
}
