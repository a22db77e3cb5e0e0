package server

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/participantd/participantd/store"
)

// TestWatchedStore_ReportsTheOldestCallInFlight holds two calls in flight
// through an inner store that blocks them, and checks that oldest names
// the first one and counts both, then nothing once they return.
func TestWatchedStore_ReportsTheOldestCallInFlight(t *testing.T) {
	release := make(chan struct{})
	inner := &blockingStore{DurableStore: store.NewMemory(), entered: make(chan struct{}, 2), release: release}
	w := watch(inner)
	done := make(chan error, 2)
	go func() { done <- w.Flush() }()
	<-inner.entered
	go func() { _, err := w.Len("oplog/1"); done <- err }()
	<-inner.entered
	call, n, ok := w.oldest()
	if !ok || n != 2 || call.String() != "Flush" {
		t.Fatalf("oldest() = %v, %d, %v; want Flush, 2, true", call, n, ok)
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if call, n, ok := w.oldest(); ok || n != 0 {
		t.Fatalf("oldest() after the calls returned = %v, %d, %v; want none", call, n, ok)
	}
	if _, ok := store.AsCompactor(watch(store.NewMemory())); !ok {
		t.Error("a watched store.Memory is not a Compactor")
	}
	if _, ok := store.AsCompactor(w); ok {
		t.Error("a watched store without Compactor is one")
	}
}

// blockingStore blocks Flush and Len until release.
type blockingStore struct {
	store.DurableStore
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Flush() error {
	b.entered <- struct{}{}
	<-b.release
	return b.DurableStore.Flush()
}

func (b *blockingStore) Len(stream string) (uint64, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.DurableStore.Len(stream)
}

// BenchmarkWatchedStore_Append compares appends from parallel goroutines to
// a store.Memory, bare and watched: the cost of tracking calls in flight.
func BenchmarkWatchedStore_Append(b *testing.B) {
	for _, watched := range []bool{false, true} {
		b.Run(fmt.Sprintf("watched=%v", watched), func(b *testing.B) {
			var st store.DurableStore = store.NewMemory()
			if watched {
				st = watch(st)
			}
			var next atomic.Uint64
			payload := make([]byte, 64)
			b.RunParallel(func(pb *testing.PB) {
				stream := fmt.Sprintf("oplog/%d", next.Add(1))
				for seq := uint64(0); pb.Next(); seq++ {
					if _, err := st.Append(stream, payload, seq); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// TestWatchedStore_KeepsOrderAsItsInnerStore checks that the watch
// answers store.Ordered for the store it wraps: without it the service
// behind the watch would flush once per barrier on the log-first store.
func TestWatchedStore_KeepsOrderAsItsInnerStore(t *testing.T) {
	if !store.KeepsOrder(watch(store.NewMemory())) {
		t.Error("a watched store.Memory does not keep order; the memory store does")
	}
	if store.KeepsOrder(watch(unorderedStore{store.NewMemory()})) {
		t.Error("a watched store that does not keep order claims to")
	}
}

// unorderedStore hides its inner store's store.Ordered.
type unorderedStore struct{ store.DurableStore }
