package participant_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
)

// TestConcurrentBatchesSurviveACrashAtAnyPoint runs tells from many
// goroutines into a few conversations, so that batches of several
// operations share barriers, and cuts the store at a random operation.
// After the crash and a restart: every answered tell replays its seq, the
// outbox is the projection of the oplog, seqs have no gap or duplicate and
// every binding ended at most once.
func TestConcurrentBatchesSurviveACrashAtAnyPoint(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	total := 0
	for round := range 12 {
		mem := store.NewMemory()
		fs := faultstore.New(mem)
		cutAt := uint64(30 + rng.IntN(400))
		fs.SetRules(faultstore.OnIndex(cutAt, faultstore.Cut))
		ctx := context.Background()
		svc, err := participant.Open(ctx, fs, participant.Options{NodeKey: participanttest.NodeKey})
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			req  participant.Tell
			seq  participant.Seq
			conn *participant.Conn
		}
		var (
			mu       sync.Mutex
			answered []answer
			wg       sync.WaitGroup
		)
		for conv := participant.ConversationID(1); conv <= 3; conv++ {
			c := svc.Connect(nil)
			a, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participanttest.TokenOf(byte(conv))})
			if err != nil {
				break // the cut came early
			}
			other := svc.Connect(nil)
			if _, err := other.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participanttest.TokenOf(byte(conv) + 10)}); err != nil {
				break
			}
			for w := range 4 {
				wg.Go(func() {
					for i := range 20 {
						var tok participant.Token
						copy(tok[:], fmt.Sprintf("r%d c%d w%d i%d", round, conv, w, i))
						req := participant.Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: tok, Payload: tok[:8]}
						told, err := c.Tell(ctx, req)
						if err != nil {
							return
						}
						mu.Lock()
						answered = append(answered, answer{req, told.Seq, c})
						mu.Unlock()
					}
				})
			}
		}
		wg.Wait()
		svc.Close()
		mem.Crash()

		svc, err = participant.Open(ctx, mem, participant.Options{NodeKey: participanttest.NodeKey})
		if err != nil {
			t.Fatalf("round %d (cut at %d): Open after the crash: %v", round, cutAt, err)
		}
		if unl := svc.Unloadable(); len(unl) != 0 {
			t.Fatalf("round %d (cut at %d): unloadable after the crash: %+v", round, cutAt, unl)
		}
		reports, err := participant.Inspect(mem)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reports {
			if r.Refused != nil || r.Repairs != 0 {
				t.Fatalf("round %d (cut at %d): conversation %v refused=%+v repairs=%d", round, cutAt, r.Conversation, r.Refused, r.Repairs)
			}
			rows, first, err := participanttest.StoredOutbox(mem, r.Conversation)
			if err != nil {
				t.Fatalf("round %d (cut at %d): outbox of %v: %v", round, cutAt, r.Conversation, err)
			}
			participanttest.CheckRecords(t, rows, first > 0)
		}
		c := svc.Connect(nil)
		for _, a := range answered {
			told, err := c.Tell(ctx, a.req)
			if err != nil || told.Seq != a.seq || told.Replay != participant.ReplayCommitted {
				t.Fatalf("round %d (cut at %d): answered tell seq %v replays as %+v, %v", round, cutAt, a.seq, told, err)
			}
		}
		total += len(answered)
		svc.Close()
	}
	if total == 0 {
		t.Fatalf("no tell was answered before any cut: the test checked nothing")
	}
	t.Logf("%d answered tells checked across the rounds", total)
}
