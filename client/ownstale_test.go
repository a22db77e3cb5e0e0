package client_test

// A refusal stale_authority that the client's own attach caused is not
// the application's (docs/clients.md, What a client's answers promise):
// a tell or ack refused so while an attach of the same participant is in
// flight or in doubt waits for that attach, settles it, and goes again
// with the credential it minted.

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// deferredCommits sets up participant b of twoMembers (conversation 2)
// whose re-attachment after a reconnect is deferred (backlog_full), and
// whose deferred retry, the next attach of conversation 2, commits and is
// answered with act (swallow, commitHeld): the server moves b to
// generation 2 while the client still presents generation 1. It returns
// once that attach committed.
func deferredCommits(t *testing.T, ctx context.Context, srv *fakeServer, c *client.Client, a client.Credential, act action) {
	t.Helper()
	f := newFullConv(srv, 2)
	committed := make(chan struct{})
	f.onAttach = func(n int) action {
		if n != 2 {
			return pass
		}
		f.full = false
		close(committed)
		return act
	}
	srv.dropAll()
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Fatalf("Tell of the re-attached participant = %v", err)
	}
	select {
	case <-committed:
	case <-ctx.Done():
		t.Fatal("the deferred re-attachment was not retried")
	}
}

// waitStack waits until some goroutine's stack holds fn, or done is
// closed; it reports whether fn was seen. It polls the stacks, as
// waitGone does.
func waitStack(t *testing.T, ctx context.Context, fn string, done <-chan struct{}) bool {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 1<<20)
	for {
		if n := runtime.Stack(buf, true); bytes.Contains(buf[:n], []byte(fn)) {
			return true
		}
		select {
		case <-tick.C:
		case <-done:
			return false
		case <-ctx.Done():
			t.Fatalf("no goroutine runs %s", fn)
		}
	}
}

// A deferred re-attachment commits (generation 2) and its answer reaches
// the client only after that of a tell presenting generation 1, refused
// stale_authority by the client's own doing: the tell waits for the
// attach in flight and goes again with generation 2, once. No OnLost.
func TestClient_Tell_OwnAttachInFlight_NotStale(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	release := holdAnswers(t, srv)
	var lost lostLog
	c, a, b := twoMembers(t, srv, client.Options{OnLost: lost.onLost})
	deferredCommits(t, ctx, srv, c, a, commitHeld)

	type told struct {
		seq uint64
		err error
	}
	out := make(chan told, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		seq, err := c.Tell(ctx, b, []byte("b"))
		out <- told{seq, err}
	}()
	// The attach's answer is released once the tell waits for it, or
	// once the tell returned without waiting.
	waitStack(t, ctx, "client.(*Client).awaitAttach", returned)
	release()
	r := <-out
	if r.err != nil {
		t.Fatalf("Tell while the client's own attach was in flight = %v, want told", r.err)
	}
	var gens []uint64
	for _, m := range tells(srv) {
		if m.Conversation == 2 {
			gens = append(gens, m.Generation)
		}
	}
	if len(gens) != 2 || gens[0] != 1 || gens[1] != 2 {
		t.Errorf("tells of conversation 2 presented generations %v, want [1 2]", gens)
	}
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost(%v)", got)
	}
}

// A deferred re-attachment commits (generation 2) and its answer never
// comes; a tell presenting generation 1 is refused stale_authority by the
// client's own doing. The tell waits for the attach, which ends in doubt
// when its connection is taken for lost, then for the reconnection that
// settles it (the same token replays generation 2), and goes again with
// the newest credential: told, and an ack after it acks. No OnLost.
func TestClient_Tell_OwnAttachInDoubt_NotStale(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var lost lostLog
	c, a, b := twoMembers(t, srv, client.Options{OnLost: lost.onLost, AnswerTimeout: 300 * time.Millisecond})
	deferredCommits(t, ctx, srv, c, a, swallow)

	if _, err := c.Tell(ctx, b, []byte("b")); err != nil {
		t.Fatalf("Tell while the client's own attach was in doubt = %v, want told", err)
	}
	if m := srv.member(2, b.Participant); m.bound == nil {
		t.Errorf("participant not bound after the tell")
	}
	cur, ok := c.Credential(2, b.Participant)
	if !ok || cur.Generation < 2 {
		t.Errorf("credential held = %v, %v; want generation 2 or later", cur, ok)
	}
	if _, err := c.Ack(ctx, b, 0); err != nil {
		t.Errorf("Ack after it = %v", err)
	}
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost(%v)", got)
	}
}

// An ack refused stale_authority while the client's own deferred
// re-attachment is in flight goes again, as a tell does.
func TestClient_Ack_OwnAttachInFlight_NotStale(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	release := holdAnswers(t, srv)
	var lost lostLog
	c, a, b := twoMembers(t, srv, client.Options{OnLost: lost.onLost})
	deferredCommits(t, ctx, srv, c, a, commitHeld)

	errc := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		_, err := c.Ack(ctx, b, 0)
		errc <- err
	}()
	waitStack(t, ctx, "client.(*Client).awaitAttach", returned)
	release()
	if err := <-errc; err != nil {
		t.Fatalf("Ack while the client's own attach was in flight = %v, want acked", err)
	}
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost(%v)", got)
	}
}

// A participant whose re-attachment is deferred and which another client
// then supersedes: a tell refused stale_authority settles the deferred
// attach, which finds the participant lost. The tell says so (a
// *LostError), and OnLost is called once, whichever of the tell and the
// deferred retry finds it first.
func TestClient_Tell_DeferredAttachSuperseded_Lost(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var lost lostLog
	c, a, b := twoMembers(t, srv, client.Options{OnLost: lost.onLost})
	f := newFullConv(srv, 2)
	srv.dropAll()
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Fatalf("Tell of the re-attached participant = %v", err)
	}
	f.waitRefused(t, ctx, 2, 1)
	srv.mu.Lock()
	srv.supersedeLocked(2, b.Participant)
	tellSeen := false
	f.onAttach = func(int) action {
		if tellSeen {
			f.full = false
		}
		return pass
	}
	srv.hook = func(fc *fconn, m wire.Message) action {
		if tl, ok := m.(*wire.Tell); ok && tl.Conversation == 2 {
			tellSeen = true
		}
		return f.hook(fc, m)
	}
	srv.mu.Unlock()

	if _, err := c.Tell(ctx, b, []byte("b")); !errors.Is(err, client.ErrParticipantLost) {
		t.Fatalf("Tell of a participant superseded while deferred = %v, want lost", err)
	}
	c.Close()
	if got := lost.all(); len(got) != 1 {
		t.Errorf("OnLost calls = %v, want one", got)
	}
}

// holdAnswers makes srv hold the answers of its commitHeld requests until
// the returned release is called (at the latest at the test's cleanup,
// before the server's).
func holdAnswers(t *testing.T, srv *fakeServer) (release func()) {
	held := make(chan struct{})
	srv.mu.Lock()
	srv.held = held
	srv.mu.Unlock()
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	return release
}
