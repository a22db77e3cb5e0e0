package client_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
)

// TestOnIntent_AnotherProcessReplaysTheAttach persists the intents of one
// client and replays its attach from a second one, as a restarted process
// would: the replay answers the generation the first attach minted, and the
// second client, whose connection never held that binding, attaches again
// and is bound.
func TestOnIntent_AnotherProcessReplaysTheAttach(t *testing.T) {
	ctx := testCtx(t)
	addr, stop := daemon(t, t.TempDir(), "127.0.0.1:0")
	defer stop()
	var mu sync.Mutex
	var intents []client.Intent
	a, err := client.Dial(ctx, addr, client.Options{OnIntent: func(in client.Intent) error {
		mu.Lock()
		defer mu.Unlock()
		intents = append(intents, in)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	enrolled, err := a.Enroll(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Dial(ctx, addr, client.Options{OnIntent: func(in client.Intent) error {
		mu.Lock()
		defer mu.Unlock()
		intents = append(intents, in)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g2, err := b.Attach(ctx, enrolled)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(intents) != 2 || intents[0].Op != client.IntentEnroll || intents[1].Op != client.IntentAttach || intents[1].Presented != enrolled {
		t.Fatalf("intents = %v, want the enroll then the attach presenting %v", intents, enrolled)
	}
	tok := intents[1].Token
	mu.Unlock()

	// A third process that knows only the intent.
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Attach(ctx, enrolled); !errors.Is(err, client.ErrStaleAuthority) {
		t.Fatalf("attach presenting the superseded credential with a fresh token = %v, want stale_authority", err)
	}
	d, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g3, err := d.Attach(ctx, enrolled, client.WithToken(tok))
	if err != nil {
		t.Fatalf("attach replaying the intent = %v", err)
	}
	if g3.Generation != g2.Generation+1 {
		t.Errorf("generation after the replay = %d, want %d (the replayed %d, then one attach here)", g3.Generation, g2.Generation+1, g2.Generation)
	}
	if _, err := d.Tell(ctx, g3, []byte("bound here")); err != nil {
		t.Errorf("tell after the replayed attach = %v, want the participant bound on this client", err)
	}
}

func TestOnIntent_ErrorStopsTheRequest(t *testing.T) {
	ctx := testCtx(t)
	addr, stop := daemon(t, t.TempDir(), "127.0.0.1:0")
	defer stop()
	a, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cred, err := a.Enroll(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	diskFull := errors.New("disk full")
	var fail atomic.Bool
	fail.Store(true)
	b, err := client.Dial(ctx, addr, client.Options{MinBackoff: time.Millisecond, OnIntent: func(client.Intent) error {
		if fail.Load() {
			return diskFull
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Enroll(ctx, 4); !errors.Is(err, diskFull) {
		t.Errorf("Enroll with a failing OnIntent = %v, want it", err)
	}
	if _, err := b.Attach(ctx, cred); !errors.Is(err, diskFull) {
		t.Errorf("Attach with a failing OnIntent = %v, want it", err)
	}
	fail.Store(false)
	// Nothing was sent: the credential still attaches, to the next
	// generation, and the refused enroll made no participant.
	got, err := b.Attach(ctx, cred)
	if err != nil || got.Generation != cred.Generation+1 {
		t.Errorf("Attach after the hook recovered = %v, %v; want generation %d", got, err, cred.Generation+1)
	}
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	next, err := c.Enroll(ctx, 4)
	if err != nil || next.Participant != 1 {
		t.Errorf("Enroll = %v, %v; want participant 1", next, err)
	}
}
