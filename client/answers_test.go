package client_test

// The truth of a call's answer (docs/clients.md, What a client's answers
// promise): success only for an operation that committed and that
// nothing the client did on its own undid; in_doubt only when a request
// may have been applied; a refusal only when nothing was.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// onFirst returns a hook that answers the first request of the type
// of sample with act, and every other request normally.
func onFirst[T wire.Message](act action) func(*fconn, wire.Message) action {
	done := false
	return func(_ *fconn, m wire.Message) action {
		if _, ok := m.(T); ok && !done {
			done = true
			return act
		}
		return pass
	}
}

// requestsAfter returns the requests the server saw after the first of
// type T, by type name.
func requestsAfter[T wire.Message](srv *fakeServer) []string {
	var out []string
	found := false
	for _, m := range srv.seen() {
		if _, ok := m.(T); ok && !found {
			found = true
			continue
		}
		if found {
			out = append(out, string(m.Type()))
		}
	}
	return out
}

// wantUnbound fails t unless the fake server holds participant p of
// conversation 1 unbound at generation 1: a detach ended its first
// binding and nothing attached it since.
func wantUnbound(t *testing.T, srv *fakeServer, p uint64) {
	t.Helper()
	if m := srv.member(1, p); m.bound != nil || m.gen != 1 {
		t.Errorf("after Detach: bound %v at generation %d, want unbound at 1", m.bound != nil, m.gen)
	}
}

// lostLog records the reasons OnLost was called with.
type lostLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *lostLog) onLost(_ client.Credential, why error) {
	l.mu.Lock()
	l.errs = append(l.errs, why)
	l.mu.Unlock()
}

func (l *lostLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// A detach that commits and whose answer is lost: the client must not
// re-attach the participant on the next connection before the retry
// (which would replay "detached" for a participant bound again). The
// retry sends the same token as it is; the participant stays unbound at
// the generation the detach ended.
func TestClient_Detach_AnswerLost_NoReattach(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	srv.setHook(onFirst[*wire.Detach](commitThenDrop))
	if _, err := c.Detach(ctx, cred); err != nil {
		t.Fatalf("Detach = %v, want the replay of the committed detach", err)
	}
	wantUnbound(t, srv, cred.Participant)
	if got, want := requestsAfter[*wire.Detach](srv), []string{"detach"}; !cmp.Equal(got, want) {
		t.Errorf("requests after the first detach = %v, want %v (no attach before the retry)", got, want)
	}
}

// A detach lost before it reached the server: the binding ended with the
// connection, and the retry, which does not re-attach first, is refused
// no_binding. The call says nothing was detached; the participant stays
// unbound and is not re-attached.
func TestClient_Detach_LostBeforeCommit_NoBinding(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	srv.setHook(onFirst[*wire.Detach](dropBefore))
	if _, err := c.Detach(ctx, cred); !errors.Is(err, client.ErrNoBinding) || errors.Is(err, client.ErrInDoubt) {
		t.Fatalf("Detach = %v, want no_binding", err)
	}
	wantUnbound(t, srv, cred.Participant)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range attaches(srv) {
		t.Errorf("attach %+v sent after the detach", a)
	}
}

// A leave whose answer is lost: the client must not re-attach the
// participant (refused retired) and report it lost; the retry replays
// the leave.
func TestClient_Leave_AnswerLost_NotLost(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var lost lostLog
	c := dialT(t, srv, client.Options{OnLost: lost.onLost})
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	srv.setHook(onFirst[*wire.Leave](commitThenDrop))
	if _, err := c.Leave(ctx, cred); err != nil {
		t.Fatalf("Leave = %v, want the replay of the committed leave", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost called with %v for a participant the application left", got)
	}
	if got, want := requestsAfter[*wire.Leave](srv), []string{"leave", "ping"}; !cmp.Equal(got, want) {
		t.Errorf("requests after the first leave = %v, want %v", got, want)
	}
}

// An ack below the cursor (a retry after a lost answer, once a later ack
// moved the cursor on) is acked: ack_regression means the seq is acked.
func TestClient_Ack_BelowCursor_IsAcked(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	if cur, err := c.Ack(ctx, cred, 5); err != nil || cur != 5 {
		t.Fatalf("Ack(5) = %d, %v", cur, err)
	}
	if cur, err := c.Ack(ctx, cred, 3); err != nil || cur != 5 {
		t.Errorf("Ack(3) after Ack(5) = %d, %v, want 5, nil", cur, err)
	}
}

// collect reads deliveries until one of conversation stop.
func collect(t *testing.T, ch <-chan client.Delivery, stop uint64) []client.Delivery {
	t.Helper()
	var out []client.Delivery
	for {
		select {
		case d := <-ch:
			if d.Conversation == stop {
				return out
			}
			out = append(out, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("no delivery of conversation %d after %v", stop, out)
		}
	}
}

type got struct {
	Recipient, Seq, First uint64
	Kind                  client.Kind
}

func gotOf(ds []client.Delivery) []got {
	var out []got
	for _, d := range ds {
		out = append(out, got{d.Recipient, d.Seq, d.First, d.Kind})
	}
	return out
}

// dedupPushes are two participants of conversation 9, each with its own
// cursor (seq 5 reached one before seq 3 reached the other), and repeats
// of each's deliveries and compacted notices.
var dedupPushes = []wire.Message{
	&wire.Delivery{Conversation: 9, Recipient: 0, Seq: 5, Kind: wire.KindRecord},
	&wire.Compacted{Conversation: 9, Recipient: 1, First: 3},
	&wire.Delivery{Conversation: 9, Recipient: 1, Seq: 3, Kind: wire.KindRecord},
	&wire.Compacted{Conversation: 9, Recipient: 1, First: 3},
	&wire.Delivery{Conversation: 9, Recipient: 1, Seq: 3, Kind: wire.KindRecord},
	&wire.Delivery{Conversation: 9, Recipient: 0, Seq: 5, Kind: wire.KindRecord},
	&wire.Delivery{Conversation: 9, Recipient: 1, Seq: 4, Kind: wire.KindRecord},
	&wire.Delivery{Conversation: 99, Recipient: 0, Seq: 1, Kind: wire.KindRecord},
}

var dedupWant = []got{
	{0, 5, 0, wire.KindRecord},
	{1, 0, 3, client.KindCompacted},
	{1, 3, 0, wire.KindRecord},
	{1, 4, 0, wire.KindRecord},
}

// Deliveries are deduplicated on (conversation, recipient, seq), and
// compacted notices on (conversation, recipient, first).
func TestClient_Deliveries_DedupPerRecipient(t *testing.T) {
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	for _, m := range dedupPushes {
		srv.pushMsg(m)
	}
	if diff := cmp.Diff(dedupWant, gotOf(collect(t, c.Deliveries(), 99))); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
}

// A tell whose payload exceeds max_record_bytes, or whose frame exceeds
// max_frame, is refused too_large before anything is sent: final, never
// in_doubt.
func TestClient_Tell_TooLarge_NotSent(t *testing.T) {
	for _, tc := range []struct {
		name                string
		maxFrame, maxRecord uint64
		payload             int
	}{
		{"over max_record_bytes", 0, 16, 17},
		{"over max_frame", 128, 1024, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := newFakeServer(t)
			srv.setLimits(tc.maxFrame, tc.maxRecord)
			c := dialT(t, srv, client.Options{})
			cred, err := c.Enroll(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Tell(ctx, cred, make([]byte, tc.payload))
			if !errors.Is(err, client.ErrTooLarge) || errors.Is(err, client.ErrInDoubt) {
				t.Errorf("Tell of %d bytes = %v, want too_large", tc.payload, err)
			}
			if n := len(tells(srv)); n != 0 {
				t.Errorf("%d tells sent, want none", n)
			}
			if got := srv.dials(); got != 1 {
				t.Errorf("%d connections, want 1", got)
			}
		})
	}
}

// A call whose context has no deadline does not hang on an answer the
// server never sends on an open connection: past AnswerTimeout the
// connection is taken for lost, and the retry (same token) learns the
// outcome.
func TestClient_AnswerDropped_CallEnds(t *testing.T) {
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{AnswerTimeout: 100 * time.Millisecond})
	cred, err := c.Enroll(testCtx(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	srv.setHook(onFirst[*wire.Tell](swallow))
	done := make(chan error, 1)
	go func() {
		_, err := c.Tell(context.Background(), cred, []byte("x"))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Tell = %v, want the replay", err)
		}
	case <-testCtx(t).Done():
		t.Fatal("Tell without a deadline hangs on an answer never sent")
	}
	if n := len(tells(srv)); n != 2 {
		t.Errorf("%d tells sent, want 2 (the swallowed one, its retry)", n)
	}
}

// A leave while the client's own re-attachment is in doubt (it committed,
// minting generation 2, and its answer was lost): the leave, presenting
// generation 1, is refused stale_authority by the client's own doing.
// The client settles its attach first (the same token replays
// generation 2) and leaves with that credential, the same leave token.
func TestClient_Leave_AttachInDoubt_Leaves(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var lost lostLog
	c := dialT(t, srv, client.Options{OnLost: lost.onLost})
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	attachesSeen, leaving := 0, false // guarded by srv.mu
	retried := make(chan struct{})
	srv.setHook(func(_ *fconn, m wire.Message) action {
		switch m.(type) {
		case *wire.Attach:
			if attachesSeen++; attachesSeen == 1 {
				return commitThenDrop
			}
			if attachesSeen == 2 {
				close(retried) // the attach is in doubt, generation 2 committed
			}
			if !leaving {
				return dropBefore
			}
		case *wire.Leave:
			leaving = true
		}
		return pass
	})
	srv.dropAll()
	select {
	case <-retried:
	case <-ctx.Done():
		t.Fatal("the re-attachment was not retried")
	}
	if _, err := c.Leave(ctx, cred); err != nil {
		t.Fatalf("Leave with the client's own attach in doubt = %v, want left", err)
	}
	if m := srv.member(1, cred.Participant); !m.retired {
		t.Errorf("participant not retired")
	}
	if got := lost.all(); len(got) != 0 {
		t.Errorf("OnLost(%v)", got)
	}
}
