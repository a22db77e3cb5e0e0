package participant

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// gatedReads holds every token index read, once armed for n of them, until
// n are in flight together; a read still alone after a generous bound is
// released and counted as sequential. Reads of failKey fail.
type gatedReads struct {
	store.DurableStore
	mu sync.Mutex
	// +checklocks:mu
	want int
	// +checklocks:mu
	inflight int
	// +checklocks:mu
	reads int
	// +checklocks:mu
	sequential int
	// +checklocks:mu
	all chan struct{}
	// +checklocks:mu
	failKey string
}

func (g *gatedReads) arm(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.want, g.inflight, g.reads, g.sequential = n, 0, 0, 0
	g.all = make(chan struct{})
}

func (g *gatedReads) ReadValue(key string) (uint64, error) {
	if strings.HasPrefix(key, "token/") {
		g.mu.Lock()
		all := g.all
		if all != nil {
			g.reads++
			g.inflight++
			if g.inflight == g.want {
				close(all)
				g.all = nil
			}
		}
		fail := key == g.failKey
		g.mu.Unlock()
		if all != nil {
			select {
			case <-all:
			case <-time.After(5 * time.Second):
				g.mu.Lock()
				g.sequential++
				if g.all == all {
					// Fail fast: the rest would each wait too.
					close(all)
					g.all = nil
				}
				g.mu.Unlock()
			}
		}
		if fail {
			return 0, errors.New("gatedReads: injected read failure")
		}
	}
	return g.DurableStore.ReadValue(key)
}

func openPrefetching(t *testing.T, st store.DurableStore, prefetch bool) *Service {
	t.Helper()
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey, PrefetchTokens: prefetch})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { svc.Close() })
	return svc
}

// startHeld queues reqs on conversation 1 while holding its turn, so that
// they are decided as one batch, and returns their answers.
func startHeld(t *testing.T, svc *Service, c *Conn, reqs []Tell) ([]Told, []error) {
	t.Helper()
	cv := svc.existing(1)
	if err := cv.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := make([]*Call[Told], len(reqs))
	for i, r := range reqs {
		calls[i] = c.StartTell(context.Background(), r)
	}
	svc.release(cv)
	told := make([]Told, len(reqs))
	errs := make([]error, len(reqs))
	for i, call := range calls {
		told[i], errs[i] = call.Wait()
	}
	return told, errs
}

// TestPrefetchTokensReadsABatchsTokensConcurrently: with PrefetchTokens, a
// batch of n tells with tokens has all n token index reads in flight
// before any returns (so a store that shares concurrent reads sends them
// together), and each tell still commits once.
func TestPrefetchTokensReadsABatchsTokensConcurrently(t *testing.T) {
	g := &gatedReads{DurableStore: store.NewMemory()}
	svc := openPrefetching(t, g, true)
	sender, receiver := svc.Connect(nil), svc.Connect(nil)
	a := mustEnroll(t, sender, 1, 1)
	mustEnroll(t, receiver, 1, 2)
	const n = 32
	reqs := make([]Tell, n)
	for i := range reqs {
		reqs[i] = Tell{Conversation: 1, Participant: a.Participant, Generation: 1, Token: token(byte(10 + i)), Payload: []byte{byte(i)}}
	}
	g.arm(n)
	_, errs := startHeld(t, svc, sender, reqs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("tell %d = %v", i, err)
		}
	}
	g.mu.Lock()
	reads, sequential := g.reads, g.sequential
	g.mu.Unlock()
	if reads != n || sequential != 0 {
		t.Fatalf("a batch of %d tells made %d token reads, %d of them alone; want %d, all in flight together", n, reads, sequential, n)
	}
	if ds := drainNext(receiver, 1); len(ds) != n {
		t.Fatalf("receiver offered %d records, want %d", len(ds), n)
	}
}

// TestPrefetchTokensAnswersAsSequentialReads plays the same batches with
// and without PrefetchTokens and wants the same answers: fresh commits,
// replays of committed tokens, a token repeated within the batch (the
// staged one wins), token_conflict, and unavailable for exactly the tell
// whose token index read fails.
func TestPrefetchTokensAnswersAsSequentialReads(t *testing.T) {
	type answer struct {
		Told Told
		Code Code
	}
	play := func(prefetch bool) [][]answer {
		g := &gatedReads{DurableStore: store.NewMemory()}
		svc := openPrefetching(t, g, prefetch)
		sender, receiver := svc.Connect(nil), svc.Connect(nil)
		a := mustEnroll(t, sender, 1, 1)
		mustEnroll(t, receiver, 1, 2)
		tell := func(tok byte, payload string) Tell {
			return Tell{Conversation: 1, Participant: a.Participant, Generation: 1, Token: token(tok), Payload: []byte(payload)}
		}
		g.failKey = tokenindex.Key(1, tokenindex.Participant(a.Participant), token(99))
		batches := [][]Tell{
			{tell(10, "a"), tell(11, "b"), tell(12, "c")},
			{
				tell(10, "a"), // replay of a committed token
				tell(13, "d"), // fresh
				tell(13, "d"), // repeat of a token staged in this batch
				tell(11, "x"), // token_conflict
				tell(99, "e"), // its index read fails: unavailable
				tell(14, "f"), // fresh, after the failed one
				tell(12, "c"), // replay
			},
		}
		var out [][]answer
		for _, reqs := range batches {
			told, errs := startHeld(t, svc, sender, reqs)
			ans := make([]answer, len(reqs))
			for i := range reqs {
				ans[i].Told = told[i]
				var e *Error
				if errors.As(errs[i], &e) {
					ans[i].Code = e.Code
				} else if errs[i] != nil {
					t.Fatalf("tell %d = %v, want an *Error", i, errs[i])
				}
			}
			out = append(out, ans)
		}
		return out
	}
	seq, pre := play(false), play(true)
	if diff := cmp.Diff(seq, pre); diff != "" {
		t.Fatalf("answers with PrefetchTokens differ from sequential reads (-sequential +prefetch):\n%s", diff)
	}
	second := seq[1]
	if second[0].Told.Replay != ReplayCommitted || second[2].Told.Replay != ReplayCommitted || second[2].Told.Seq != second[1].Told.Seq ||
		second[3].Code != CodeTokenConflict || second[4].Code != CodeUnavailable || second[5].Code != "" || second[5].Told.Replay != ReplayNone {
		t.Fatalf("second batch answered %+v", second)
	}
}
