package fence_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/participantd/participantd/fence"
)

// A thousand workers holding sibling tokens of one redelivered attempt race
// to complete, each behind its own lease, while the leases settle: exactly
// one completion becomes truth and every other one finds no generation.
func TestAThousandSiblingsRacingToCompleteYieldExactlyOneWinner(t *testing.T) {
	const workers = 1000
	f := fence.New[site](fence.Options{})
	s := site{conversation: 5, participant: 1}
	tokens := make([]fence.Token, workers)
	for i := range tokens {
		tokens[i] = f.Issue(s, runKey(s, 1), 1)
		f.ArmLease(tokens[i])
	}
	if got := fence.Outstanding(f, s); got != workers {
		t.Fatalf("Outstanding after %d redeliveries = %d, want %d", workers, got, workers)
	}

	start := make(chan struct{})
	var wg sync.WaitGroup
	var winners atomic.Int32
	unexpected := make(chan error, workers)
	for _, tok := range tokens {
		wg.Go(func() {
			<-start
			_, err := f.Accept(context.Background(), s, tok)
			switch {
			case err == nil:
				winners.Add(1)
			case !errors.Is(err, fence.ErrNoCurrentGeneration):
				unexpected <- err
			}
		})
	}
	close(start)
	for _, tok := range tokens {
		f.SettleLease(tok)
	}
	wg.Wait()
	close(unexpected)

	for err := range unexpected {
		t.Errorf("a losing sibling got %v, want %v", err, fence.ErrNoCurrentGeneration)
	}
	if got := winners.Load(); got != 1 {
		t.Fatalf("accepted completions = %d, want exactly 1", got)
	}
}
