package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dialT(t *testing.T, srv *fakeServer, opts client.Options) *client.Client {
	t.Helper()
	opts.MinBackoff = time.Millisecond
	opts.MaxBackoff = 10 * time.Millisecond
	c, err := client.Dial(testCtx(t), srv.addr(), opts)
	if err != nil {
		t.Fatalf("Dial = %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// enrollT dials srv as dialT does, with the default options, and enrolls
// a participant in conversation 1.
func enrollT(ctx context.Context, t *testing.T, srv *fakeServer) (*client.Client, client.Credential) {
	t.Helper()
	c := dialT(t, srv, client.Options{})
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return c, cred
}

func next(t *testing.T, c *client.Client) client.Delivery {
	t.Helper()
	select {
	case d := <-c.Deliveries():
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
		return client.Delivery{}
	}
}

// tells returns the tell requests the server saw.
func tells(srv *fakeServer) []*wire.Tell {
	var out []*wire.Tell
	for _, m := range srv.seen() {
		if t, ok := m.(*wire.Tell); ok {
			out = append(out, t)
		}
	}
	return out
}

func attaches(srv *fakeServer) []*wire.Attach {
	var out []*wire.Attach
	for _, m := range srv.seen() {
		if a, ok := m.(*wire.Attach); ok {
			out = append(out, a)
		}
	}
	return out
}

func TestClient_EnrollTellDeliverAck(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	a := dialT(t, srv, client.Options{ClientName: "a"})
	b := dialT(t, srv, client.Options{ClientName: "b"})
	if w := a.Welcome(); w.Incarnation != 7 || w.Connection == 0 || w.MaxRecordBytes != 16 {
		t.Errorf("Welcome() = %+v", w)
	}
	ca, err := a.Enroll(ctx, 42)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Enroll(ctx, 42)
	if err != nil {
		t.Fatal(err)
	}
	if ca.Participant != 0 || cb.Participant != 1 || ca.Generation != 1 {
		t.Fatalf("Enroll = %v, %v", ca, cb)
	}
	seq, err := a.Tell(ctx, ca, []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	// a sees b's joined, b sees a's record.
	if d := next(t, a); d.Kind != wire.KindJoined || d.Participant != 1 {
		t.Errorf("a got %+v, want joined of 1", d)
	}
	d := next(t, b)
	if d.Kind != wire.KindRecord || d.Seq != seq || string(d.Payload) != "hi" || d.Recipient != 1 {
		t.Errorf("b got %+v, want record %d", d, seq)
	}
	if d.Credential != cb {
		t.Errorf("b's delivery carries credential %v, want %v", d.Credential, cb)
	}
	if cur, err := b.Ack(ctx, d.Credential, d.Seq); err != nil || cur != d.Seq {
		t.Errorf("Ack(%d) = %d, %v", d.Seq, cur, err)
	}
	if err := a.Ping(ctx); err != nil {
		t.Errorf("Ping = %v", err)
	}
}

func TestClient_Pipelining_ManyCallsInFlight(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{DiscardDeliveries: true})
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	seqs := make(chan uint64, n)
	for i := range n {
		wg.Go(func() {
			s, err := c.Tell(ctx, cred, fmt.Appendf(nil, "m%d", i))
			if err != nil {
				t.Error(err)
			}
			seqs <- s
		})
	}
	wg.Wait()
	close(seqs)
	seen := map[uint64]bool{}
	for s := range seqs {
		if seen[s] {
			t.Errorf("seq %d answered twice", s)
		}
		seen[s] = true
	}
}

func TestClient_Tell_InDoubtRetriedWithSameToken(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	first := true
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Tell); ok && first {
			first = false
			return commitInDoubt
		}
		return pass
	})
	seq, err := c.Tell(ctx, cred, []byte("x"))
	if err != nil {
		t.Fatalf("Tell = %v", err)
	}
	ts := tells(srv)
	if len(ts) != 2 || ts[0].Token != ts[1].Token || ts[0].ID == ts[1].ID {
		t.Fatalf("tells = %+v, want two with one token and two ids", ts)
	}
	if seq != 2 {
		t.Errorf("Tell = %d, want 2 (the committed seq)", seq)
	}
}

func TestClient_Tell_ConnectionDropBeforeAnswer_RetriedAfterReattach(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	var mu sync.Mutex
	var creds []client.Credential
	c := dialT(t, srv, client.Options{OnCredential: func(cr client.Credential) {
		mu.Lock()
		creds = append(creds, cr)
		mu.Unlock()
	}})
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	first := true
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Tell); ok && first {
			first = false
			return commitThenDrop
		}
		return pass
	})
	seq, err := c.Tell(ctx, cred, []byte("x"))
	if err != nil {
		t.Fatalf("Tell = %v", err)
	}
	ts := tells(srv)
	if len(ts) != 2 || ts[0].Token != ts[1].Token {
		t.Fatalf("tells = %+v, want two with one token", ts)
	}
	if ts[1].Generation != 2 {
		t.Errorf("retried tell generation = %d, want 2 (after re-attach)", ts[1].Generation)
	}
	if seq != 2 {
		t.Errorf("Tell = %d, want 2", seq)
	}
	got, ok := c.Credential(1, cred.Participant)
	if want := srv.member(1, cred.Participant); !ok || got.Generation != want.gen || got.Secret != want.secrets[want.gen] {
		t.Errorf("Credential() = %v, want the server's generation %d and its secret", got, want.gen)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(creds) != 2 || creds[1].Generation != 2 {
		t.Errorf("OnCredential calls = %v, want generations 1 and 2", creds)
	}
}

func TestClient_Reconnect_ReattachesWithLatestCredential(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(2); want <= 4; want++ {
		srv.dropAll()
		// The tell waits for the re-attachment; it fails if the client
		// presented an old credential (the participant would be lost).
		if _, err := c.Tell(ctx, cred, []byte("x")); err != nil {
			t.Fatalf("Tell after drop %d = %v", want-1, err)
		}
		if got, _ := c.Credential(5, cred.Participant); got.Generation != want {
			t.Errorf("generation after drop = %d, want %d", got.Generation, want)
		}
	}
	as := attaches(srv)
	for i, a := range as {
		if a.Generation != uint64(i+1) {
			t.Errorf("attach %d presented generation %d, want %d", i, a.Generation, i+1)
		}
	}
}

func TestClient_Reattach_AnswerLost_RetriedWithSameTokenAndCredential(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	first := true
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Attach); ok && first {
			first = false
			return commitThenDrop
		}
		return pass
	})
	srv.dropAll()
	if _, err := c.Tell(ctx, cred, []byte("x")); err != nil {
		t.Fatalf("Tell = %v", err)
	}
	as := attaches(srv)
	if len(as) != 3 {
		t.Fatalf("attaches = %d, want 3 (lost, replayed unbound, fresh)", len(as))
	}
	if as[0].Token != as[1].Token || as[0].Generation != as[1].Generation || as[0].Secret != as[1].Secret {
		t.Errorf("retried attach differs from the first: %+v vs %+v", as[0], as[1])
	}
	if as[2].Token == as[1].Token || as[2].Generation != 2 {
		t.Errorf("third attach = %+v, want a new token presenting generation 2", as[2])
	}
	if got, _ := c.Credential(5, cred.Participant); got.Generation != 3 {
		t.Errorf("generation = %d, want 3", got.Generation)
	}
}

func TestClient_Reattach_Superseded_ParticipantLost(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Attach); ok {
			n++
			switch n {
			case 1:
				// The attach commits and its answer is lost...
				return commitThenDrop
			case 2:
				// ...and someone else attaches with the credential it
				// minted before the client retries.
				srv.supersedeLocked(5, cred.Participant)
			}
		}
		return pass
	})
	srv.dropAll()
	_, err = c.Tell(ctx, cred, []byte("x"))
	if !errors.Is(err, client.ErrParticipantLost) || !errors.Is(err, client.ErrReceiptExpired) {
		t.Fatalf("Tell = %v, want participant lost by receipt_expired", err)
	}
	// The tell may have gone out on the connection that dropped: then the
	// error is in_doubt, wrapping the loss.
	var le *client.LostError
	var ce *client.Error
	if !errors.As(err, &le) || !errors.As(le.Err, &ce) || ce.Reason != wire.ExpiredSuperseded {
		t.Errorf("error = %#v, want reason superseded", err)
	}
	// The client still serves: a new participant works.
	if _, err := c.Enroll(ctx, 6); err != nil {
		t.Errorf("Enroll after a lost participant = %v", err)
	}
}

func TestClient_Deliveries_Deduplicated(t *testing.T) {
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []uint64{1, 2, 2, 1, 3, 3} {
		srv.push(&wire.Delivery{Conversation: 9, Recipient: 0, Seq: s, Kind: wire.KindRecord, Participant: 1, Payload: []byte{byte(s)}})
	}
	srv.push(&wire.Delivery{Conversation: 10, Seq: 1, Kind: wire.KindDied, Cause: ptr(wire.CauseConnectionLost)})
	for _, want := range []uint64{1, 2, 3} {
		if d := next(t, c); d.Conversation != 9 || d.Seq != want {
			t.Fatalf("delivery = %+v, want conversation 9 seq %d", d, want)
		}
	}
	if d := next(t, c); d.Conversation != 10 || d.Cause != wire.CauseConnectionLost {
		t.Errorf("delivery = %+v, want conversation 10 died/connection_lost", d)
	}
}

func TestClient_TypedErrors(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	_, err := c.Tell(ctx, cred, make([]byte, 17))
	var ce *client.Error
	if !errors.Is(err, client.ErrTooLarge) || !errors.As(err, &ce) || ce.Limit == nil || *ce.Limit != 16 {
		t.Errorf("Tell(17 bytes) = %v, want too_large with limit 16", err)
	}
	if errors.Is(err, client.ErrStaleAuthority) {
		t.Errorf("too_large matches ErrStaleAuthority")
	}
	other := client.Credential{Conversation: 1, Participant: 99, Generation: 1}
	if _, err := c.Tell(ctx, other, []byte("x")); !errors.Is(err, client.ErrUnknownParticipant) {
		t.Errorf("Tell(unknown) = %v, want unknown_participant", err)
	}
	if _, err := c.Attach(ctx, client.Credential{Conversation: 1, Participant: cred.Participant, Generation: 9}); !errors.Is(err, client.ErrStaleAuthority) {
		// The client holds the participant, so it presents its own
		// (current) credential and the attach succeeds.
		if err != nil {
			t.Errorf("Attach(held participant) = %v", err)
		}
	}
	if _, err := c.Ack(ctx, cred, 0); err != nil {
		t.Errorf("Ack(0) = %v", err)
	}
}

func TestClient_Leave_ForgetsParticipant(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	if _, err := c.Leave(ctx, cred); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Credential(1, cred.Participant); ok {
		t.Error("client still holds the participant after Leave")
	}
	if _, err := c.Tell(ctx, cred, nil); !errors.Is(err, client.ErrRetired) {
		t.Errorf("Tell after Leave = %v, want retired", err)
	}
}

func TestClient_ServerBye_Reconnects(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	before := c.Welcome().Connection
	srv.sayBye()
	if _, err := c.Tell(ctx, cred, []byte("after bye")); err != nil {
		t.Fatalf("Tell after bye = %v", err)
	}
	if after := c.Welcome().Connection; after <= before {
		t.Errorf("connection ordinal = %d after bye, want > %d", after, before)
	}
}

func TestClient_ContextEnds_InDoubtWithToken(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Tell); ok {
			return commitInDoubt
		}
		return pass
	})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := c.Tell(short, cred, []byte("x"))
	var ce *client.Error
	if !errors.Is(err, client.ErrInDoubt) || !errors.As(err, &ce) || ce.Token.IsZero() || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Tell = %v, want in_doubt with a token, wrapping the deadline", err)
	}
	srv.setHook(nil)
	seq, err := c.Tell(ctx, cred, []byte("x"), client.WithToken(ce.Token))
	if err != nil || seq != 2 {
		t.Errorf("Tell(same token) = %d, %v, want the committed seq 2", seq, err)
	}
	if _, err := c.Tell(ctx, cred, []byte("y"), client.WithToken(ce.Token)); !errors.Is(err, client.ErrTokenConflict) {
		t.Errorf("Tell(same token, other payload) = %v, want token_conflict", err)
	}
}

func TestDial_AuthFailed(t *testing.T) {
	srv := newFakeServer(t)
	srv.auth = "sesame"
	_, err := client.Dial(testCtx(t), srv.addr(), client.Options{AuthToken: "wrong"})
	var re *client.RejectedError
	if !errors.As(err, &re) || re.Reason != wire.ReasonAuthFailed || !errors.Is(err, client.ErrRejected) {
		t.Fatalf("Dial = %v, want rejected auth_failed", err)
	}
	c, err := client.Dial(testCtx(t), srv.addr(), client.Options{AuthToken: "sesame"})
	if err != nil {
		t.Fatalf("Dial(right token) = %v", err)
	}
	c.Close()
}

func TestClient_Close_CallsReturnErrClosed(t *testing.T) {
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	c.Close()
	c.Close()
	if err := c.Ping(testCtx(t)); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Ping after Close = %v, want ErrClosed", err)
	}
	if _, ok := <-c.Deliveries(); ok {
		t.Error("Deliveries not closed by Close")
	}
}

func TestCredential_JSONRoundTrip(t *testing.T) {
	in := client.Credential{Conversation: 42, Participant: 3, Generation: 7}
	in.Secret[0], in.Secret[31] = 0xab, 0xcd
	b, err := in.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"conversation":42,"participant":3,"generation":7,"secret":"ab000000000000000000000000000000000000000000000000000000000000cd"}`
	if string(b) != want {
		t.Errorf("MarshalJSON = %s, want %s", b, want)
	}
	var out client.Credential
	if err := out.UnmarshalJSON(b); err != nil || out != in {
		t.Errorf("UnmarshalJSON = %v, %v, want %v", out, err, in)
	}
	if err := out.UnmarshalJSON([]byte(`{"generation":1,"secret":"00"}`)); err == nil {
		t.Error("UnmarshalJSON accepted a short secret")
	}
}

func TestNewToken_NeverZeroAndDistinct(t *testing.T) {
	a, b := client.NewToken(), client.NewToken()
	if a.IsZero() || a == b {
		t.Errorf("NewToken() = %v, %v", a, b)
	}
	p, err := client.ParseToken(a.String())
	if err != nil || p != a {
		t.Errorf("ParseToken(%v) = %v, %v", a, p, err)
	}
	if _, err := client.ParseToken("00000000000000000000000000000000"); err == nil {
		t.Error("ParseToken accepted the zero token")
	}
}

func TestClient_Enroll_AnswerLost_ReplayedThenAttached(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{})
	first := true
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Enroll); ok && first {
			first = false
			return commitThenDrop
		}
		return pass
	})
	cred, err := c.Enroll(ctx, 3)
	if err != nil {
		t.Fatalf("Enroll = %v", err)
	}
	if cred.Participant != 0 || cred.Generation != 2 {
		t.Errorf("Enroll = %v, want participant 0 re-attached at generation 2", cred)
	}
	var enrolls []*wire.Enroll
	for _, m := range srv.seen() {
		if e, ok := m.(*wire.Enroll); ok {
			enrolls = append(enrolls, e)
		}
	}
	if len(enrolls) != 2 || enrolls[0].Token != enrolls[1].Token {
		t.Errorf("enrolls = %+v, want two with one token", enrolls)
	}
	if _, err := c.Tell(ctx, cred, []byte("x")); err != nil {
		t.Errorf("Tell = %v", err)
	}
}

// TestClient_Deliveries_QueueIsBounded: a reader that falls behind gets
// backpressure, not unbounded memory: once DeliveryBuffer and
// MaxQueuedDeliveries are full the client stops reading the connection
// (so an answer behind the deliveries waits), and reading resumes it with
// nothing lost.
func TestClient_Deliveries_QueueIsBounded(t *testing.T) {
	srv := newFakeServer(t)
	c := dialT(t, srv, client.Options{DeliveryBuffer: 1, MaxQueuedDeliveries: 2})
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for s := uint64(1); s <= n; s++ {
		srv.push(&wire.Delivery{Conversation: 9, Seq: s, Kind: wire.KindRecord, Participant: 1, Payload: []byte{byte(s)}})
	}
	// The ping's answer is behind deliveries the client has no room for.
	short, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(short); err == nil {
		t.Fatalf("Ping answered while %d deliveries waited behind a full queue", n)
	}
	for s := uint64(1); s <= n; s++ {
		if d := next(t, c); d.Seq != s {
			t.Fatalf("delivery seq %d, want %d", d.Seq, s)
		}
	}
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatalf("Ping after the queue drained: %v", err)
	}
}

// TestClient_Tell_BacklogFullRetriedWithSameTokenUntilAdmitted: a tell
// refused backlog_full is retried with backoff and its token until the
// server admits it, and commits once.
func TestClient_Tell_BacklogFullRetriedWithSameTokenUntilAdmitted(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	refusals := 3
	srv.setHook(func(_ *fconn, m wire.Message) action {
		if _, ok := m.(*wire.Tell); ok && refusals > 0 {
			refusals--
			return backlogFull
		}
		return pass
	})
	seq, err := c.Tell(ctx, cred, []byte("x"))
	if err != nil {
		t.Fatalf("Tell = %v, want it admitted after the backlog drained", err)
	}
	ts := tells(srv)
	if len(ts) != 4 {
		t.Fatalf("server saw %d tells, want 4 (3 refused, then the commit)", len(ts))
	}
	for _, tl := range ts[1:] {
		if tl.Token != ts[0].Token {
			t.Fatalf("retry carried token %v, want the first one %v", tl.Token, ts[0].Token)
		}
	}
	if seq != 2 {
		t.Errorf("Tell = %d, want 2", seq)
	}
}

// TestClient_Tell_BacklogFullPastTheWaitIsReturned: past BacklogWait (or
// at once when it is negative) the refusal reaches the caller as
// ErrBacklogFull with its limit, not as in_doubt: nothing was done.
func TestClient_Tell_BacklogFullPastTheWaitIsReturned(t *testing.T) {
	for _, wait := range []time.Duration{-1, 30 * time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			ctx := testCtx(t)
			srv := newFakeServer(t)
			c := dialT(t, srv, client.Options{BacklogWait: wait})
			cred, err := c.Enroll(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			srv.setHook(func(_ *fconn, m wire.Message) action {
				if _, ok := m.(*wire.Tell); ok {
					return backlogFull
				}
				return pass
			})
			_, err = c.Tell(ctx, cred, []byte("x"))
			var ce *client.Error
			if !errors.Is(err, client.ErrBacklogFull) || !errors.As(err, &ce) || ce.Limit == nil || *ce.Limit != 100 {
				t.Fatalf("Tell = %v, want backlog_full with limit 100", err)
			}
			if n := len(tells(srv)); wait < 0 && n != 1 {
				t.Errorf("with a negative BacklogWait the tell was sent %d times, want once", n)
			}
			// A context that ends while waiting between retries returns
			// the refusal too. (One that ends while a retry awaits its
			// answer is in_doubt, rightly.) The backoff dwarfs the
			// context, so the context ends during the wait however slow
			// the shared machine is, unless one round trip takes 200ms.
			c2, err := client.Dial(ctx, srv.addr(), client.Options{BacklogWait: time.Hour,
				MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c2.Close() })
			cred2, err := c2.Enroll(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			if _, err := c2.Tell(short, cred2, []byte("y")); !errors.Is(err, client.ErrBacklogFull) {
				t.Errorf("Tell whose context ended while the backlog is full = %v, want backlog_full", err)
			}
		})
	}
}
