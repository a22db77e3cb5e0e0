package participant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/store"
)

// TestBatch_BarriersShareASyncOnlyWhereTheStoreKeepsOrder records the
// store calls of a tell's commit. Over a store that keeps its writes'
// order (store.Ordered) the oplog append comes first, then the outbox
// append, then one flush that makes both durable; over one that does not,
// each barrier has its flush: oplog append, flush, outbox append, flush.
func TestBatch_BarriersShareASyncOnlyWhereTheStoreKeepsOrder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		unordered bool
		want      string
	}{
		{"ordered", false, "append oplog/7, append outbox/7, flush"},
		{"unordered", true, "append oplog/7, flush, append outbox/7, flush"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			fs := faultstore.New(store.NewMemory())
			fs.SetUnordered(tc.unordered)
			svc := openService(t, fs)
			const conv = 7
			sender := svc.Connect(nil)
			a, err := sender.Enroll(ctx, Enroll{Conversation: conv, Token: token(1)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: conv, Token: token(2)}); err != nil {
				t.Fatal(err)
			}
			var (
				mu    sync.Mutex
				calls []string
			)
			fs.SetObserver(func(op faultstore.Op, _ faultstore.Action, _ error) {
				var call string
				switch op.Kind {
				case faultstore.OpAppend:
					call = fmt.Sprintf("append %s", op.Name)
				case faultstore.OpFlush:
					call = "flush"
				default:
					return
				}
				mu.Lock()
				calls = append(calls, call)
				mu.Unlock()
			})
			if _, err := sender.Tell(ctx, Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: token(3), Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			fs.SetObserver(nil)
			mu.Lock()
			got := strings.Join(calls, ", ")
			mu.Unlock()
			if got != tc.want {
				t.Fatalf("a tell's appends and flushes = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBatch_AGapLeftBetweenSharedBarriersIsRepaired lets another
// writer's group commit land between a tell's oplog and outbox appends on
// a store that keeps order (faultstore.FlushFirst), then crashes before
// the tell's own flush: the oplog row is durable without its outbox row,
// the gap one shared sync leaves. The answer was in_doubt; the restart
// repairs the outbox byte for byte (the row a healthy commit writes), and
// the retry with the token replays the seq.
func TestBatch_AGapLeftBetweenSharedBarriersIsRepaired(t *testing.T) {
	ctx := context.Background()
	const conv = 9
	tell := func(a Bound) Tell {
		return Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation, Token: token(3), Payload: []byte("gap")}
	}
	// The outbox a healthy run writes.
	healthy := store.NewMemory()
	{
		svc := openService(t, healthy)
		c := svc.Connect(nil)
		a, err := c.Enroll(ctx, Enroll{Conversation: conv, Token: token(1)})
		must(t, err)
		_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: conv, Token: token(2)})
		must(t, err)
		_, err = c.Tell(ctx, tell(a))
		must(t, err)
	}
	want := rawOutbox(t, healthy, conv)

	mem := store.NewMemory()
	fs := faultstore.New(mem)
	svc := openService(t, fs)
	sender := svc.Connect(nil)
	a, err := sender.Enroll(ctx, Enroll{Conversation: conv, Token: token(1)})
	must(t, err)
	_, err = svc.Connect(nil).Enroll(ctx, Enroll{Conversation: conv, Token: token(2)})
	must(t, err)
	// The group commit lands before the outbox append; the process dies at
	// the flush after it.
	fs.SetRules(faultstore.First(
		faultstore.Once(faultstore.When(faultstore.FlushFirst, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(outbox.StreamPrefix))),
		faultstore.When(faultstore.Cut, faultstore.Kind(faultstore.OpFlush)),
	))
	if _, err := sender.Tell(ctx, tell(a)); !errors.Is(err, ErrInDoubt) {
		t.Fatalf("Tell cut before its flush = %v, want in_doubt", err)
	}
	svc.Close()
	mem.Crash()

	if n := oplogLen(t, mem, conv); n != 4 {
		t.Fatalf("oplog rows after the crash = %d, want 4: the group commit made the tell's row durable", n)
	}
	if n := len(rawOutbox(t, mem, conv)); n != len(want)-1 {
		t.Fatalf("outbox rows after the crash = %d, want %d: the tell's row was lost, a gap", n, len(want)-1)
	}
	reports, err := Inspect(mem)
	must(t, err)
	if len(reports) != 1 || reports[0].Repairs != 1 {
		t.Fatalf("Inspect before the restart = %+v, want one conversation with one row to repair", reports)
	}

	svc = openService(t, mem)
	rows := oplogLen(t, mem, conv)
	if got := rawOutbox(t, mem, conv); !equalRows(got[:len(want)], want) {
		t.Fatalf("repaired outbox differs from a healthy commit's:\n got %x\nwant %x", got, want)
	}
	told, err := svc.Connect(nil).Tell(ctx, tell(a))
	if err == nil {
		// The restart ended the sender's binding; a committed token
		// replays whatever binding presents it.
		err = fmt.Errorf("replay %+v", told)
		if told.Replay == ReplayCommitted && told.Seq == 3 {
			err = nil
		}
	}
	if err != nil {
		t.Fatalf("retry of the in-doubt tell: %v, want a committed replay of seq 3", err)
	}
	if n := oplogLen(t, mem, conv); n != rows {
		t.Fatalf("the retry committed again: %d oplog rows, want %d", n, rows)
	}
}
