package client_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
	"go.uber.org/goleak"
)

// waitGone waits until no goroutine runs fn. It polls the goroutine stacks,
// as goleak does: the end of a goroutine has no other signal.
func waitGone(t *testing.T, ctx context.Context, fn string) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 1<<20)
	for {
		if n := runtime.Stack(buf, true); !bytes.Contains(buf[:n], []byte(fn)) {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("a goroutine still runs %s", fn)
		}
	}
}

// dials returns how many connections the fake server accepted.
func (s *fakeServer) dials() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ordinal
}

// fullConv scripts a conversation whose backlog is full for attaches: while
// full, every attach of conv is refused backlog_full. It records on which
// connection and with which token each attach of conv came. Its fields are
// guarded by srv.mu, which the hook runs with.
type fullConv struct {
	srv      *fakeServer
	conv     uint64
	full     bool
	refused  map[uint64]int // connection ordinal -> refusals on it
	waiters  []refusalWaiter
	attaches []sentAttach
	// onAttach, if set, runs for every attach of conv before the refusal
	// (srv.mu held); a non-pass action is returned as is.
	onAttach func(n int) action
}

type sentAttach struct {
	Conn  uint64
	Token wire.Token
}

type refusalWaiter struct {
	conn uint64
	n    int
	ch   chan struct{}
}

func newFullConv(srv *fakeServer, conv uint64) *fullConv {
	f := &fullConv{srv: srv, conv: conv, full: true, refused: make(map[uint64]int)}
	srv.setHook(f.hook)
	return f
}

func (f *fullConv) hook(fc *fconn, m wire.Message) action {
	a, ok := m.(*wire.Attach)
	if !ok || a.Conversation != f.conv {
		return pass
	}
	f.attaches = append(f.attaches, sentAttach{fc.n, a.Token})
	if f.onAttach != nil {
		if act := f.onAttach(len(f.attaches)); act != pass {
			return act
		}
	}
	if !f.full {
		return pass
	}
	f.refused[fc.n]++
	keep := f.waiters[:0]
	for _, w := range f.waiters {
		if w.conn == fc.n && f.refused[fc.n] >= w.n {
			close(w.ch)
			continue
		}
		keep = append(keep, w)
	}
	f.waiters = keep
	return backlogFull
}

// waitRefused waits until n attaches of conv were refused on connection
// conn.
func (f *fullConv) waitRefused(t *testing.T, ctx context.Context, conn uint64, n int) {
	t.Helper()
	ch := make(chan struct{})
	f.srv.mu.Lock()
	if f.refused[conn] >= n {
		close(ch)
	} else {
		f.waiters = append(f.waiters, refusalWaiter{conn, n, ch})
	}
	f.srv.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("%d attaches of conversation %d were not refused on connection %d", n, f.conv, conn)
	}
}

func (f *fullConv) drain() {
	f.srv.mu.Lock()
	f.full = false
	f.srv.mu.Unlock()
}

func (f *fullConv) sent() []sentAttach {
	f.srv.mu.Lock()
	defer f.srv.mu.Unlock()
	return append([]sentAttach(nil), f.attaches...)
}

// sendTo returns an OnCredential that sends to ch, dropping what does not
// fit: a client that churns its connection (the bug these tests catch)
// re-attaches without end and must not block on the test.
func sendTo(ch chan<- client.Credential) func(client.Credential) {
	return func(cr client.Credential) {
		select {
		case ch <- cr:
		default:
		}
	}
}

// waitCredential waits for OnCredential to report generation gen of conv.
func waitCredential(t *testing.T, ctx context.Context, creds <-chan client.Credential, conv, gen uint64) {
	t.Helper()
	for {
		select {
		case cr := <-creds:
			if cr.Conversation == conv && cr.Generation == gen {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no credential of generation %d for conversation %d", gen, conv)
		}
	}
}

// twoMembers dials a client holding one participant in conversation 1 and
// one in conversation 2. BacklogWait is short so that a client that waits
// it out during the re-attach (instead of deferring) churns quickly.
func twoMembers(t *testing.T, srv *fakeServer, opts client.Options) (*client.Client, client.Credential, client.Credential) {
	t.Helper()
	ctx := testCtx(t)
	opts.BacklogWait = 20 * time.Millisecond
	c := dialT(t, srv, opts)
	a, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Enroll(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	return c, a, b
}

// TestClient_Reattach_BacklogFullDeferred_OthersServedWithoutRedial: after a
// reconnect, a participant whose re-attach is refused backlog_full does not
// hold the connection hostage: the other participant is re-attached and
// served on it at once, the connection is not re-dialed, a tell of the
// deferred one is no_binding (not lost), and it is attached on the same
// connection, with the token of its first refused attach, once the backlog
// drains.
func TestClient_Reattach_BacklogFullDeferred_OthersServedWithoutRedial(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	creds := make(chan client.Credential, 64)
	c, a, b := twoMembers(t, srv, client.Options{OnCredential: sendTo(creds)})
	f := newFullConv(srv, 2)
	srv.dropAll()

	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Tell(short, a, []byte("a")); err != nil {
		t.Fatalf("Tell of the participant whose conversation is not full = %v, want it served", err)
	}
	f.waitRefused(t, ctx, 2, 3)
	if _, err := c.Tell(ctx, b, []byte("b")); !errors.Is(err, client.ErrNoBinding) || errors.Is(err, client.ErrParticipantLost) {
		t.Fatalf("Tell of the deferred participant = %v, want no_binding (not lost)", err)
	}
	if n := srv.dials(); n != 2 {
		t.Fatalf("connections = %d while a re-attach is deferred, want 2 (no re-dial)", n)
	}

	f.drain()
	waitCredential(t, ctx, creds, 2, 2)
	if _, err := c.Tell(ctx, b, []byte("b")); err != nil {
		t.Fatalf("Tell of the deferred participant once attached = %v", err)
	}
	if n := srv.dials(); n != 2 {
		t.Errorf("connections = %d, want 2", n)
	}
	as := f.sent()
	if len(as) < 4 {
		t.Fatalf("attaches of the deferred participant = %d, want at least 4 (3+ refused, then admitted)", len(as))
	}
	want := make([]sentAttach, len(as))
	for i := range want {
		want[i] = sentAttach{Conn: 2, Token: as[0].Token}
	}
	if diff := cmp.Diff(want, as); diff != "" {
		t.Errorf("attaches of the deferred participant (-want +got):\n%s", diff)
	}
	if got := srv.member(2, b.Participant).gen; got != 2 {
		t.Errorf("server generation of the deferred participant = %d, want 2 (attached once)", got)
	}
}

// TestClient_Reattach_BacklogFullDeferred_CloseStopsTheRetry: Close during
// a deferred re-attach stops its retry and leaves no goroutine.
func TestClient_Reattach_BacklogFullDeferred_CloseStopsTheRetry(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ignore := goleak.IgnoreCurrent()
	c, a, _ := twoMembers(t, srv, client.Options{})
	f := newFullConv(srv, 2)
	srv.dropAll()
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Fatalf("Tell = %v", err)
	}
	f.waitRefused(t, ctx, 2, 3)
	c.Close()
	n := len(f.sent())
	goleak.VerifyNone(t, ignore)
	if got := len(f.sent()); got != n {
		t.Errorf("attaches after Close = %d, want none", got-n)
	}
}

// TestClient_Reattach_BacklogFullDeferred_SessionEndsThenSameToken: when the
// connection ends while a re-attach is deferred, the next connection
// re-attaches the participant as usual, with the same token (its outcome is
// known: refused, but the intent stands until it commits).
func TestClient_Reattach_BacklogFullDeferred_SessionEndsThenSameToken(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	creds := make(chan client.Credential, 64)
	c, a, b := twoMembers(t, srv, client.Options{OnCredential: sendTo(creds)})
	f := newFullConv(srv, 2)
	srv.dropAll()
	f.waitRefused(t, ctx, 2, 2)
	srv.dropAll()
	f.waitRefused(t, ctx, 3, 2)
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Fatalf("Tell = %v", err)
	}
	f.drain()
	waitCredential(t, ctx, creds, 2, 2)
	if _, err := c.Tell(ctx, b, []byte("b")); err != nil {
		t.Fatalf("Tell of the deferred participant once attached = %v", err)
	}
	as := f.sent()
	conns := map[uint64]bool{}
	for _, s := range as {
		conns[s.Conn] = true
		if s.Token != as[0].Token {
			t.Fatalf("attaches = %v, want one token throughout", as)
		}
	}
	if !conns[2] || !conns[3] || len(conns) != 2 {
		t.Errorf("attaches came on connections %v, want 2 and 3", conns)
	}
	if n := srv.dials(); n != 3 {
		t.Errorf("connections = %d, want 3", n)
	}
}

// TestClient_Reattach_BacklogFullDeferred_PermanentRefusalLoses: a deferred
// re-attach refused for good (here stale_authority: another session
// attached the participant meanwhile) marks the participant lost and calls
// OnLost, without touching the connection.
func TestClient_Reattach_BacklogFullDeferred_PermanentRefusalLoses(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	lost := make(chan error, 4)
	c, a, b := twoMembers(t, srv, client.Options{OnLost: func(_ client.Credential, why error) { lost <- why }})
	f := newFullConv(srv, 2)
	f.onAttach = func(n int) action {
		if n == 3 {
			f.full = false
			srv.supersedeLocked(2, b.Participant)
		}
		return pass
	}
	srv.dropAll()
	select {
	case why := <-lost:
		if !errors.Is(why, client.ErrParticipantLost) || !errors.Is(why, client.ErrStaleAuthority) {
			t.Errorf("OnLost reason = %v, want lost by stale_authority", why)
		}
	case <-ctx.Done():
		t.Fatal("OnLost not called")
	}
	if _, err := c.Tell(ctx, b, []byte("b")); !errors.Is(err, client.ErrParticipantLost) {
		t.Errorf("Tell of the lost participant = %v, want ErrParticipantLost", err)
	}
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Errorf("Tell of the other participant = %v", err)
	}
	if n := srv.dials(); n != 2 {
		t.Errorf("connections = %d, want 2", n)
	}
}

// TestClient_Reattach_BacklogFullDeferred_Attach: the caller's Attach of a
// deferred participant tries at once with the deferred attach's token
// (backlog_full past BacklogWait, not lost, while the conversation is
// full), and once it drains attaches it with that token.
func TestClient_Reattach_BacklogFullDeferred_Attach(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, a, b := twoMembers(t, srv, client.Options{})
	f := newFullConv(srv, 2)
	srv.dropAll()
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Fatalf("Tell = %v", err)
	}
	f.waitRefused(t, ctx, 2, 2)
	if _, err := c.Attach(ctx, b); !errors.Is(err, client.ErrBacklogFull) || errors.Is(err, client.ErrParticipantLost) {
		t.Fatalf("Attach of the deferred participant while full = %v, want backlog_full", err)
	}
	f.drain()
	got, err := c.Attach(ctx, b)
	if err != nil || got.Generation != 2 {
		t.Fatalf("Attach once drained = %v, %v; want generation 2", got, err)
	}
	as := f.sent()
	for _, s := range as {
		if s.Token != as[0].Token || s.Conn != 2 {
			t.Fatalf("attaches = %v, want one token, all on connection 2", as)
		}
	}
	if _, err := c.Tell(ctx, b, []byte("b")); err != nil {
		t.Errorf("Tell once attached = %v", err)
	}
}

// TestClient_Reattach_BacklogFullDeferred_Leave: a Leave of a deferred
// participant retires it and ends its retry: no OnLost (its retry would be
// refused retired), and no attach of it once the backlog drains.
func TestClient_Reattach_BacklogFullDeferred_Leave(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var lost lostLog
	c, a, b := twoMembers(t, srv, client.Options{OnLost: lost.onLost})
	f := newFullConv(srv, 2)
	srv.dropAll()
	if _, err := c.Tell(ctx, a, []byte("a")); err != nil {
		t.Fatalf("Tell = %v", err)
	}
	f.waitRefused(t, ctx, 2, 2)
	if _, err := c.Leave(ctx, b); err != nil {
		t.Fatalf("Leave of the deferred participant = %v", err)
	}
	f.drain()
	// The retry ends on its own: the client no longer holds the
	// participant. (Were it to try again, the attach would be refused
	// retired: OnLost.)
	waitGone(t, ctx, "client.(*Client).retryAttach")
	c.Close()
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost calls = %v, want none", got)
	}
	if _, ok := c.Credential(2, b.Participant); ok {
		t.Errorf("the client still holds the participant that left")
	}
}
