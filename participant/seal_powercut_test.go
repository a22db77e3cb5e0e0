package participant_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
)

// concurrentTells is a power-cut workload of concurrent batches: three
// conversations, each told by four goroutines at once, so that batches
// of one conversation commit while another's log record is being
// written: with the store's order hidden (faultstore.SetUnordered, its
// seals still the log-first store's), batches seal their
// oplog rows and append their outbox rows behind it (sealed barriers,
// which the sequential workloads never reach: their seals find the log
// idle and write their record themselves); otherwise both barriers share
// one sync, other batches' group commits landing between their appends.
// On the one-sync path a batch of tells hands the turn on before its
// commit is durable, and the next one is decided while it is in flight
// (pipelined batches); pipelined counts them.
// It records every answered tell and returns the first failure.
func concurrentTells(seal bool, pipelined *atomic.Uint64) func(s store.DurableStore, log *[]participanttest.Answered) error {
	return func(s store.DurableStore, log *[]participanttest.Answered) error {
		fs, ok := s.(*faultstore.Store)
		if !ok {
			return fmt.Errorf("concurrentTells over %T, want a faultstore", s)
		}
		fs.SetUnordered(seal)
		return concurrentTellsOn(s, log, pipelined)
	}
}

func concurrentTellsOn(s store.DurableStore, log *[]participanttest.Answered, pipelined *atomic.Uint64) error {
	ctx := context.Background()
	*log = (*log)[:0]
	svc, err := participant.Open(ctx, s, participant.Options{NodeKey: participanttest.NodeKey})
	if err != nil {
		return err
	}
	defer svc.Close()
	defer func() { pipelined.Add(svc.Pipelined()) }()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for conv := participant.ConversationID(1); conv <= 3; conv++ {
		c := svc.Connect(nil)
		a, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participanttest.TokenOf(byte(conv))})
		if err != nil {
			wg.Wait()
			return err
		}
		if _, err := svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: conv, Token: participanttest.TokenOf(byte(conv) + 10)}); err != nil {
			wg.Wait()
			return err
		}
		for w := range 4 {
			wg.Go(func() {
				for i := range 6 {
					var tok participant.Token
					copy(tok[:], fmt.Sprintf("c%d w%d i%d", conv, w, i))
					req := participant.Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: tok, Payload: tok[:8]}
					told, err := c.Tell(ctx, req)
					mu.Lock()
					if err != nil {
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
					*log = append(*log, participanttest.Answered{What: fmt.Sprintf("tell %v seq %v", conv, told.Seq),
						Check: func(ctx context.Context, c *participant.Conn, _ store.DurableStore) error {
							r, err := c.Tell(ctx, req)
							if err != nil || r.Seq != told.Seq || r.Replay != participant.ReplayCommitted {
								return fmt.Errorf("retry = %+v, %v; want seq %v replayed", r, err, told.Seq)
							}
							return nil
						}})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return first
}

// TestPowerCut_ConcurrentSealedBatches is TestPowerCut with concurrent
// batches (concurrentTells) on the sealed path: a power cut at a
// file-system call may fall while a sealed oplog record is being written
// with outbox rows of its batch staged behind it, or between the two
// records. Every start must keep every answered tell (its retry replays
// its seq), hold the outbox to the projection of the oplog, and load
// every conversation.
func TestPowerCut_ConcurrentSealedBatches(t *testing.T) {
	testPowerCutConcurrent(t, true)
}

// TestPowerCut_ConcurrentOneSyncBatches is the same on the path the
// log-first store takes, one sync for both barriers: a cut may fall with
// a batch's oplog rows in a record another batch's group commit wrote
// and its outbox rows not yet in any.
func TestPowerCut_ConcurrentOneSyncBatches(t *testing.T) {
	testPowerCutConcurrent(t, false)
}

func testPowerCutConcurrent(t *testing.T, seal bool) {
	runs := 60
	if testing.Short() {
		runs = 20
	}
	loaded := func(t faultstore.TB, st store.DurableStore) {
		reports, err := participant.Inspect(st)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		for _, r := range reports {
			if r.Refused != nil {
				t.Fatalf("conversation %v refused after the complete run: %+v", r.Conversation, r.Refused)
			}
		}
	}
	var pipelined atomic.Uint64
	powerCutLoop{workload: concurrentTells(seal, &pipelined), completed: loaded,
		compact: participant.Options{Retain: time.Nanosecond, Now: time.Now}, runs: runs, stream: 9}.run(t)
	// Sealed barriers (the store's order hidden) never pipeline; one
	// sync for both does, and the loop proves nothing of it unless some
	// batch was decided while the one before it was in flight.
	switch n := pipelined.Load(); {
	case seal && n > 0:
		t.Fatalf("%d batches pipelined on the sealed path, want none", n)
	case !seal && n == 0:
		t.Fatal("no batch pipelined: the loop never decided a batch while the one before it was in flight")
	default:
		t.Logf("%d batches pipelined", n)
	}
}
