package stage

import (
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/participantd/participantd/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Flushes with writes staged share the next batch; only the first wakes
// the committer.
func TestGroup_JoinLocked_StagedFlushesShareTheNextBatch(t *testing.T) {
	g := NewGroup()
	first, wake := g.JoinLocked(true)
	if first == nil || !wake {
		t.Fatalf("first JoinLocked(staged) = %v, wake %v; want a new batch and a wake", first, wake)
	}
	second, wake := g.JoinLocked(true)
	if second != first || wake {
		t.Fatalf("second JoinLocked(staged) = %p, wake %v; want %p and no wake", second, wake, first)
	}
}

// A Flush with nothing staged waits for the batch in flight, and for
// nothing when there is none.
func TestGroup_JoinLocked_NothingStagedWaitsForTheBatchInFlight(t *testing.T) {
	g := NewGroup()
	if bt, _ := g.JoinLocked(false); bt != nil {
		t.Fatalf("JoinLocked(nothing staged) on an idle group = %p, want nil", bt)
	}
	g.JoinLocked(true)
	inflight := g.TakeLocked()
	if bt, wake := g.JoinLocked(false); bt != inflight || wake {
		t.Fatalf("JoinLocked(nothing staged) = %p, wake %v; want the batch in flight %p", bt, wake, inflight)
	}
	if next, _ := g.JoinLocked(true); next == inflight {
		t.Fatal("JoinLocked(staged) joined the batch in flight, which took its writes before they were staged")
	}
	g.EndLocked()
	if g.BusyLocked() {
		t.Fatal("BusyLocked after EndLocked")
	}
}

// The committer commits once per wake, and Close fails the batch a Flush
// still waits for with store.ErrClosed.
func TestGroup_Run_CommitsPerWakeAndFailsTheNextBatchOnClose(t *testing.T) {
	var mu sync.Mutex
	g := NewGroup()
	quit := make(chan struct{})
	done := make(chan struct{})
	committed := make(chan *Batch)
	commit := func() {
		mu.Lock()
		bt := g.TakeLocked()
		mu.Unlock()
		if bt == nil {
			return
		}
		committed <- bt
		mu.Lock()
		g.EndLocked()
		mu.Unlock()
		bt.Finish(nil)
	}
	go func() {
		defer close(done)
		g.Run(&mu, quit, commit)
	}()

	mu.Lock()
	bt, wake := g.JoinLocked(true)
	mu.Unlock()
	errc := make(chan error)
	go func() { errc <- g.Wait(bt, wake) }()
	if got := <-committed; got != bt {
		t.Fatalf("committer took %p, want %p", got, bt)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}

	mu.Lock()
	bt, _ = g.JoinLocked(true) // no wake: Close comes first
	mu.Unlock()
	close(quit)
	<-done
	if err := bt.Wait(); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Wait after Close = %v, want store.ErrClosed", err)
	}
}

// A batch stops taking writes when it is taken, or when Close finishes
// it untaken (a Seal waiting for the take then gets the batch's error);
// a batch a Flush writes itself is taken from the start.
func TestBatch_Taken_ClosedByTheTakeOrByClose(t *testing.T) {
	taken := func(bt *Batch) bool {
		select {
		case <-bt.Taken():
			return true
		default:
			return false
		}
	}
	g := NewGroup()
	bt, _ := g.JoinLocked(true)
	if taken(bt) {
		t.Fatal("the next batch is taken before TakeLocked")
	}
	if g.TakeLocked() != bt || !taken(bt) {
		t.Fatal("TakeLocked did not mark the batch taken")
	}
	g.EndLocked()
	if own := g.StartLocked(); !taken(own) {
		t.Fatal("a batch from StartLocked is not taken")
	}
	g.EndLocked()

	var mu sync.Mutex
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		g.Run(&mu, quit, func() {})
	}()
	mu.Lock()
	untaken, _ := g.JoinLocked(true) // no wake: Close comes first
	mu.Unlock()
	close(quit)
	<-done
	if !taken(untaken) {
		t.Fatal("Close finished the next batch without marking it taken")
	}
	if err := untaken.Wait(); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Wait after Close = %v, want store.ErrClosed", err)
	}
}

func TestDropFront(t *testing.T) {
	a, b := []byte("a"), []byte("b")
	if got := DropFront([][]byte{a, b}, 2); got != nil {
		t.Errorf("DropFront(all) = %q, want nil", got)
	}
	in := [][]byte{a, b}
	got := DropFront(in, 1)
	if len(got) != 1 || string(got[0]) != "b" {
		t.Fatalf("DropFront(1) = %q, want [b]", got)
	}
	got[0] = a
	if string(in[1]) != "b" {
		t.Error("DropFront shares its result with its input")
	}
}
