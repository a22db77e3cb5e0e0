package participant

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/store"
)

// heapProbe is a memory store that measures the live heap after every page
// a reader takes from it: the page just read is still referenced then, so
// the peak is what readers held at their fullest.
type heapProbe struct {
	*store.Memory

	mu sync.Mutex
	// +checklocks:mu
	peak uint64
}

func (h *heapProbe) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	page, err := h.Memory.ReadPage(stream, offset, limit, maxBytes)
	h.sample()
	runtime.KeepAlive(page)
	return page, err
}

func (h *heapProbe) ReadFrom(stream string, offset uint64, limit int) ([]store.Entry, error) {
	entries, err := h.Memory.ReadFrom(stream, offset, limit)
	h.sample()
	runtime.KeepAlive(entries)
	return entries, err
}

func (h *heapProbe) sample() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if live := liveHeap(); live > h.peak {
		h.peak = live
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestOpen_ReconcilesLongHistoriesWithinTheLoadBudget gives eight
// conversations 8 MiB of acknowledged history each and restarts the
// service with room for two reconciliations' pages: the live heap during
// the start stays within a few pages of the baseline, instead of holding
// each history (and its decoded copy) whole, eight at once.
func TestOpen_ReconcilesLongHistoriesWithinTheLoadBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB of history")
	}
	ctx := context.Background()
	const (
		conversations = 8
		tells         = 256
		payloadBytes  = 32 << 10
	)
	probe := &heapProbe{Memory: store.NewMemory()}
	svc, err := Open(ctx, probe, Options{NodeKey: testKey})
	must(t, err)
	payload := make([]byte, payloadBytes)
	for conv := ConversationID(1); conv <= conversations; conv++ {
		sender, reader := svc.Connect(nil), svc.Connect(nil)
		a := mustEnroll(t, sender, conv, 1)
		b := mustEnroll(t, reader, conv, 2)
		// The sender acknowledges the reader's joined record, so that
		// every record is settled once the reader acknowledged it.
		_, err := sender.Ack(ctx, Ack{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Through: 2})
		must(t, err)
		var last Seq
		for i := range uint64(tells) {
			told, err := sender.Tell(ctx, Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation,
				Token: benchToken(uint64(conv), i), Payload: payload})
			must(t, err)
			last = told.Seq
			if i%64 == 63 || i == tells-1 {
				_, err := reader.Ack(ctx, Ack{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Through: last})
				must(t, err)
			}
		}
	}
	must(t, svc.Close())
	svc, payload = nil, nil

	const page = DefaultReadPageBytes
	baseline := liveHeap()
	probe.peak = 0
	svc, err = Open(ctx, probe, Options{NodeKey: testKey, LoadWorkers: 64, LoadBytes: 4 * page})
	must(t, err)
	defer svc.Close()
	if n := len(svc.Unloadable()); n != 0 {
		t.Fatalf("Unloadable() has %d conversations, want none", n)
	}
	// Two reconciliations of two pages each, their decoded rows, and
	// slack for the runtime; a whole history is 8 MiB.
	const bound = 4*page + 8<<20
	t.Logf("live heap grew by %d MiB during Open", (int64(probe.peak)-int64(baseline))>>20)
	if grew := int64(probe.peak) - int64(baseline); grew > bound {
		t.Fatalf("live heap during Open grew by %d MiB over the %d MiB baseline, want at most %d MiB",
			grew>>20, baseline>>20, bound>>20)
	}
}

func TestByteBudget_GrantsInOrderWithinCapacity(t *testing.T) {
	ctx := context.Background()
	b := newByteBudget(10)
	first, err := b.acquire(ctx, 6)
	if err != nil || first != 6 {
		t.Fatalf("acquire(6) = %d, %v, want 6, nil", first, err)
	}
	// Larger than the capacity: clipped, and it waits for the first.
	bigDone := make(chan int64)
	go func() {
		n, _ := b.acquire(ctx, 100)
		bigDone <- n
	}()
	waitWaiters(t, b, 1)
	// A small request that would fit must queue behind the big one.
	smallDone := make(chan int64)
	go func() {
		n, _ := b.acquire(ctx, 1)
		smallDone <- n
	}()
	waitWaiters(t, b, 2)
	b.release(first)
	if n := <-bigDone; n != 10 {
		t.Fatalf("acquire(100) on capacity 10 = %d, want 10", n)
	}
	select {
	case <-smallDone:
		t.Fatal("acquire(1) was granted while the whole capacity is held")
	default:
	}
	b.release(10)
	if n := <-smallDone; n != 1 {
		t.Fatalf("acquire(1) = %d, want 1", n)
	}
	b.release(1)
}

func TestByteBudget_CancelledWaiterTakesNothing(t *testing.T) {
	b := newByteBudget(4)
	held, err := b.acquire(context.Background(), 4)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if n, err := b.acquire(ctx, 1); !errors.Is(err, context.DeadlineExceeded) || n != 0 {
		t.Fatalf("acquire on a full budget with an ending ctx = %d, %v, want 0, DeadlineExceeded", n, err)
	}
	b.release(held)
	if n, err := b.acquire(context.Background(), 4); err != nil || n != 4 {
		t.Fatalf("acquire(4) after the cancelled waiter = %d, %v, want 4, nil", n, err)
	}
}

// waitWaiters waits until b has n queued waiters.
func waitWaiters(t *testing.T, b *byteBudget, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		got := len(b.waiters)
		b.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("byte budget has %d waiters, want %d", got, n)
		}
		runtime.Gosched()
	}
}
