package participant

import (
	"context"
	"crypto/rand"
	"errors"
	"runtime"
	"sync"
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

// TestPipelinedEnrollsRespectTheConnectionCap starts many enrolls into
// distinct conversations from one connection before any is answered, and
// waits for them concurrently, so that their conversations decide in
// parallel: no more than MaxConversationsPerConn may commit.
func TestPipelinedEnrollsRespectTheConnectionCap(t *testing.T) {
	const limit, n = 8, 200
	svc, err := Open(context.Background(), store.NewMemory(), Options{NodeKey: testKey, MaxConversationsPerConn: limit})
	must(t, err)
	t.Cleanup(func() { svc.Close() })
	c := svc.Connect(nil)
	ctx := context.Background()
	calls := make([]*Call[Bound], n)
	for i := range calls {
		var tok Token
		rand.Read(tok[:])
		calls[i] = c.StartEnroll(ctx, Enroll{Conversation: ConversationID(i + 1), Token: tok})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() { _, errs[i] = call.Wait() })
	}
	wg.Wait()
	committed := 0
	for i, err := range errs {
		var pe *Error
		switch {
		case err == nil:
			committed++
		case errors.As(err, &pe) && pe.Code == CodeCapacityExceeded:
			if pe.Limit != limit {
				t.Errorf("enroll %d refused with limit %d, want %d", i, pe.Limit, limit)
			}
		default:
			t.Errorf("enroll %d = %v, want ok or capacity_exceeded", i, err)
		}
	}
	if committed != limit {
		t.Errorf("%d pipelined enrolls committed past a cap of %d, want exactly %d", committed, limit, limit)
	}
	if got := len(c.Bindings()); got != limit {
		t.Errorf("the connection holds %d bindings, want %d", got, limit)
	}
	// The refused enrolls released their reservations: after a detach, one
	// more enroll fits.
	b := c.Bindings()[0]
	if _, err := c.Detach(ctx, Detach{Conversation: b.Conversation, Participant: b.Participant, Generation: 1, Token: token(9)}); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := c.Enroll(ctx, Enroll{Conversation: n + 1, Token: token(10)}); err != nil {
		t.Errorf("Enroll after a detach freed a slot = %v, want ok", err)
	}
}
