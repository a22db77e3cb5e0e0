package participant

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/participantd/participantd/faultstore"
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
		svc, err := Open(ctx, fs, Options{NodeKey: testKey})
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			req  Tell
			seq  Seq
			conn *Conn
		}
		var (
			mu       sync.Mutex
			answered []answer
			wg       sync.WaitGroup
		)
		for conv := ConversationID(1); conv <= 3; conv++ {
			c := svc.Connect(nil)
			a, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: token(byte(conv))})
			if err != nil {
				break // the cut came early
			}
			other := svc.Connect(nil)
			if _, err := other.Enroll(ctx, Enroll{Conversation: conv, Token: token(byte(conv) + 10)}); err != nil {
				break
			}
			for w := range 4 {
				wg.Go(func() {
					for i := range 20 {
						var tok Token
						copy(tok[:], fmt.Sprintf("r%d c%d w%d i%d", round, conv, w, i))
						req := Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: tok, Payload: tok[:8]}
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

		svc = openService(t, mem)
		if unl := svc.Unloadable(); len(unl) != 0 {
			t.Fatalf("round %d (cut at %d): unloadable after the crash: %+v", round, cutAt, unl)
		}
		reports, err := Inspect(mem)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reports {
			if r.Refused != nil || r.Repairs != 0 {
				t.Fatalf("round %d (cut at %d): conversation %v refused=%+v repairs=%d", round, cutAt, r.Conversation, r.Refused, r.Repairs)
			}
			checkRecords(t, decodeOutbox(t, rawOutbox(t, mem, r.Conversation)), false)
		}
		c := svc.Connect(nil)
		for _, a := range answered {
			told, err := c.Tell(ctx, a.req)
			if err != nil || told.Seq != a.seq || told.Replay != ReplayCommitted {
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
