package participant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// countingStore counts flushes that reach the store.
type countingStore struct {
	store.DurableStore
	mu sync.Mutex
	// +checklocks:mu
	flushes int
}

func (c *countingStore) Flush() error {
	c.mu.Lock()
	c.flushes++
	c.mu.Unlock()
	return c.DurableStore.Flush()
}

// TestConcurrentOperationsOnOneConversationShareBarriers sends many tells
// at once into one conversation: each is answered with its own seq, the
// seqs are gap-free, every record reaches the other participant once, and
// the operations share flushes instead of paying two each.
func TestConcurrentOperationsOnOneConversationShareBarriers(t *testing.T) {
	ctx := context.Background()
	cs := &countingStore{DurableStore: store.NewMemory()}
	svc := openService(t, cs)
	sender, receiver := svc.Connect(nil), svc.Connect(nil)
	a, err := sender.Enroll(ctx, Enroll{Conversation: 1, Token: token(1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := receiver.Enroll(ctx, Enroll{Conversation: 1, Token: token(2)}); err != nil {
		t.Fatal(err)
	}
	const workers, each = 16, 25
	cs.mu.Lock()
	before := cs.flushes
	cs.mu.Unlock()
	// The turn is held until every worker's first tell is queued, so that
	// the first batch holds all of them however the scheduler runs the
	// workers. (A gate on the first flush that waited for the others to
	// queue behind it hung whenever that batch already held two: a worker
	// sends its next tell only once its last is answered.)
	cv := svc.existing(1)
	if err := cv.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	seqs := make(chan Seq, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				var tok Token
				copy(tok[:], fmt.Sprintf("w%02d-i%03d", w, i))
				told, err := sender.Tell(ctx, Tell{Conversation: 1, Participant: a.Participant, Generation: 1, Token: tok, Payload: tok[:]})
				if err != nil {
					t.Errorf("Tell: %v", err)
					return
				}
				seqs <- told.Seq
			}
		}()
	}
	waitQueued(t, cv, workers)
	svc.release(cv)
	wg.Wait()
	close(seqs)
	seen := map[Seq]bool{}
	for q := range seqs {
		if seen[q] {
			t.Fatalf("seq %v answered twice", q)
		}
		seen[q] = true
	}
	for q := Seq(3); q < Seq(3+workers*each); q++ {
		if !seen[q] {
			t.Fatalf("seq %v missing from the answers", q)
		}
	}
	if ds := drainNext(receiver, 1); len(ds) != workers*each {
		t.Fatalf("receiver offered %d records, want %d", len(ds), workers*each)
	}
	cs.mu.Lock()
	flushes := cs.flushes - before
	cs.mu.Unlock()
	if flushes >= 2*workers*each {
		t.Fatalf("%d tells made %d flushes: concurrent operations on one conversation did not share barriers", workers*each, flushes)
	}
	t.Logf("%d tells, %d flushes", workers*each, flushes)
}

// TestAFailedBatchFailsEveryOperationFromItsFirstCommit: when the writes of
// a batch fail, every operation decided from the first staged one on gets
// the failure, since its decision may rest on the failed commits; retries
// with the same tokens then settle each one exactly once.
func TestAFailedBatchFailsEveryOperationFromItsFirstCommit(t *testing.T) {
	ctx := context.Background()
	fs := faultstore.New(store.NewMemory())
	svc := openService(t, fs)
	sender, receiver := svc.Connect(nil), svc.Connect(nil)
	a := mustEnroll(t, sender, 1, 1)
	mustEnroll(t, receiver, 1, 2)
	cv := svc.existing(1)
	// Hold the turn so that the tells queue up into one batch.
	if err := cv.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	fs.SetRules(faultstore.Once(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix(outbox.StreamPrefix))))
	const n = 8
	errs := make(chan error, n)
	reqs := make([]Tell, n)
	for i := range n {
		reqs[i] = Tell{Conversation: 1, Participant: a.Participant, Generation: 1, Token: token(byte(10 + i)), Payload: []byte{byte(i)}}
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := sender.Tell(ctx, reqs[i])
			errs <- err
		}()
	}
	waitQueued(t, cv, n)
	svc.release(cv)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrInDoubt) {
			t.Fatalf("a tell of a failed batch = %v, want in_doubt", err)
		}
	}
	svc.waitReloads()
	seen := map[Seq]bool{}
	for _, r := range reqs {
		told, err := sender.Tell(ctx, r)
		if err != nil || told.Replay != ReplayCommitted || seen[told.Seq] {
			t.Fatalf("retry = %+v, %v; want each tell committed once (the batch's oplog rows were durable)", told, err)
		}
		seen[told.Seq] = true
	}
}

// waitQueued waits until n operations are queued on cv.
func waitQueued(t *testing.T, cv *conversation, n int) {
	t.Helper()
	for range 1_000_000 {
		cv.qmu.Lock()
		q := len(cv.queue)
		cv.qmu.Unlock()
		if q >= n {
			return
		}
		runtimeGosched()
	}
	t.Fatalf("operations never queued")
}
