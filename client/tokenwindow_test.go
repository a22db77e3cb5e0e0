package client_test

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// NewToken draws UUIDv7 tokens of the current time, which a server running
// a token window accepts, distinct and ordered in the order drawn. Drawn
// faster than one per 256 ns, their sub-millisecond counter carries into
// the next millisecond, so a token may run a little ahead of the clock:
// far less than the skew a window server allows (participant.DefaultTokenSkew,
// a minute); this test allows a second.
func TestNewToken_IsAnOrderedUUIDv7OfNow(t *testing.T) {
	const ahead = 1000 // ms
	prev := client.Token{}
	for i := range 10000 {
		before := time.Now().UnixMilli()
		tok := client.NewToken()
		after := time.Now().UnixMilli()
		ms, ok := tok.UnixMilli()
		if !ok || ms < before || ms > after+ahead {
			t.Fatalf("draw %d: NewToken() = %s, UnixMilli %d, %v; want a UUIDv7 in [%d, %d]", i, tok, ms, ok, before, after+ahead)
		}
		if tok.IsZero() || bytes.Compare(tok[:], prev[:]) <= 0 {
			t.Fatalf("draw %d: NewToken() = %s after %s; want non-zero and ascending", i, tok, prev)
		}
		prev = tok
	}
}

// The token window's refusals are final answers: the call returns them
// with their extras after one send, and the connection keeps serving.
func TestClient_TokenWindowRefusalsAreNotRetried(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	c, cred := enrollT(ctx, t, srv)
	conn := c.Welcome().Connection
	for _, tc := range []struct {
		name     string
		refusal  wire.Error
		sentinel error
	}{
		{"expired", wire.Error{Code: wire.CodeTokenExpired, Detail: "old", Oldest: ptr[uint64](1767225600000)}, client.ErrTokenExpired},
		{"ahead of the clock", wire.Error{Code: wire.CodeTokenInvalid, Detail: "ahead", Newest: ptr[uint64](1767225660000)}, client.ErrTokenInvalid},
		{"not a UUIDv7", wire.Error{Code: wire.CodeTokenInvalid, Detail: "not v7"}, client.ErrTokenInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.mu.Lock()
			srv.refusal = tc.refusal
			srv.mu.Unlock()
			srv.setHook(func(_ *fconn, m wire.Message) action {
				switch m.(type) {
				case *wire.Tell, *wire.Enroll, *wire.Detach:
					return refuse
				}
				return pass
			})
			before := len(srv.seen())
			want := &client.Error{Code: tc.refusal.Code, Detail: tc.refusal.Detail, Oldest: tc.refusal.Oldest, Newest: tc.refusal.Newest}
			_, errTell := c.Tell(ctx, cred, []byte("x"))
			_, errEnroll := c.Enroll(ctx, 2)
			_, errDetach := c.Detach(ctx, cred)
			for name, err := range map[string]error{"Tell": errTell, "Enroll": errEnroll, "Detach": errDetach} {
				var ce *client.Error
				if !errors.Is(err, tc.sentinel) || !errors.As(err, &ce) {
					t.Fatalf("%s = %v, want %v", name, err, tc.sentinel)
				}
				if diff := cmp.Diff(want, ce, cmp.AllowUnexported(client.Error{})); diff != "" {
					t.Errorf("%s error (-want +got):\n%s", name, diff)
				}
			}
			if n := len(srv.seen()) - before; n != 3 {
				t.Errorf("the server saw %d requests for 3 refused calls, want 3: a refusal was retried", n)
			}
			srv.setHook(nil)
			if _, err := c.Tell(ctx, cred, []byte("y")); err != nil {
				t.Errorf("Tell after the refusal = %v", err)
			}
			if got := c.Welcome().Connection; got != conn {
				t.Errorf("connection %d after the refusals, want %d: the client reconnected", got, conn)
			}
		})
	}
}

// A re-attachment after a reconnect whose token is refused token_invalid,
// or token_expired for the fresh token that replaced an expired one, loses
// its participant, as receipt_expired does, without churning the new
// connection, which serves the rest.
func TestClient_Reattach_TokenWindowRefusal_ParticipantLost(t *testing.T) {
	for _, tc := range []struct {
		code  wire.Code
		sends int // attaches sent before the participant is lost
	}{
		{wire.CodeTokenExpired, 2}, // the first token, then its one renewal
		{wire.CodeTokenInvalid, 1},
	} {
		t.Run(string(tc.code), func(t *testing.T) {
			code := tc.code
			ctx := testCtx(t)
			srv := newFakeServer(t)
			ev := newEvents()
			c := dialT(t, srv, ev.options())
			lost, err := c.Enroll(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			kept, err := c.Enroll(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			srv.mu.Lock()
			srv.refusal = wire.Error{Code: code, Detail: "scripted", Oldest: ptr[uint64](1)}
			srv.mu.Unlock()
			srv.setHook(func(_ *fconn, m wire.Message) action {
				if a, ok := m.(*wire.Attach); ok && a.Conversation == 1 {
					return refuse
				}
				return pass
			})
			srv.dropAll()
			// The re-attachments run in any order; the reconnect follows both.
			ev.waitFor(t, "reconnect")
			ev.mu.Lock()
			tail := append([]string(nil), ev.log[len(ev.log)-3:len(ev.log)-1]...)
			reasons := append([]error(nil), ev.lost...)
			ev.mu.Unlock()
			if diff := cmp.Diff([]string{"credential g2", "lost p" + itoa(lost.Participant) + " g1"}, tail,
				cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Fatalf("callbacks before the reconnect (-want +got):\n%s", diff)
			}
			if len(reasons) != 1 {
				t.Fatalf("OnLost called %d times, want 1", len(reasons))
			}
			reason := reasons[0]
			if !errors.Is(reason, client.ErrParticipantLost) || !errors.Is(reason, &client.Error{Code: code}) {
				t.Errorf("OnLost reason = %v, want participant lost by %s", reason, code)
			}
			conn := c.Welcome().Connection
			if _, err := c.Tell(ctx, kept, []byte("x")); err != nil {
				t.Errorf("Tell of the other participant = %v", err)
			}
			if _, err := c.Tell(ctx, lost, []byte("x")); !errors.Is(err, client.ErrParticipantLost) {
				t.Errorf("Tell of the lost participant = %v, want participant lost", err)
			}
			sent := attachesIn(srv, 1)
			if len(sent) != tc.sends {
				t.Fatalf("the lost participant's attach was sent %d times, want %d", len(sent), tc.sends)
			}
			if tc.sends == 2 && sent[0].Token == sent[1].Token {
				t.Errorf("the retry after token_expired reused token %v, want a new one", sent[1].Token)
			}
			if got := c.Welcome().Connection; got != conn {
				t.Errorf("connection %d, want %d: the refusal churned the connection", got, conn)
			}
		})
	}
}

// attachesIn returns the attaches of conversation conv the server saw, in
// the order it saw them.
func attachesIn(srv *fakeServer, conv uint64) []*wire.Attach {
	var out []*wire.Attach
	for _, a := range attaches(srv) {
		if a.Conversation == conv {
			out = append(out, a)
		}
	}
	return out
}

// expireFirstAttach makes the server refuse the first attach of
// conversation conv token_expired; before refusing it, commit (when set)
// commits it and then forgets its token, as a server whose window passed
// over a committed attach does.
func expireFirstAttach(srv *fakeServer, conv uint64, commit bool) {
	srv.mu.Lock()
	srv.refusal = wire.Error{Code: wire.CodeTokenExpired, Detail: "scripted", Oldest: ptr[uint64](1)}
	srv.mu.Unlock()
	done := false
	srv.setHook(func(fc *fconn, m wire.Message) action {
		a, ok := m.(*wire.Attach)
		if !ok || a.Conversation != conv || done {
			return pass
		}
		done = true
		if commit {
			srv.applyLocked(fc, m)
			delete(srv.convs[conv].members[a.Participant].tokens, a.Token)
		}
		return refuse
	})
}

// A re-attachment after a reconnect refused token_expired is retried once
// with a new token presenting the same credential, which OnIntent sees
// before it is sent: the participant is re-attached, not lost, and the
// connection serves on.
func TestClient_Reattach_TokenExpired_RetriedWithNewToken(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	opts := ev.options()
	type seenIntent struct {
		in        client.Intent
		sentFirst bool // the server had seen an attach with its token
	}
	var (
		mu      sync.Mutex
		intents []seenIntent
	)
	opts.OnIntent = func(in client.Intent) error {
		if in.Op != client.IntentAttach {
			return nil
		}
		sent := false
		for _, a := range attaches(srv) {
			sent = sent || client.Token(a.Token) == in.Token
		}
		mu.Lock()
		intents = append(intents, seenIntent{in, sent})
		mu.Unlock()
		return nil
	}
	c := dialT(t, srv, opts)
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	expireFirstAttach(srv, 1, false)
	srv.dropAll()
	ev.waitFor(t, "credential g2", "reconnect")
	conn := c.Welcome().Connection
	if conn != 2 {
		t.Errorf("connection %d after one drop, want 2: the refusal churned the connection", conn)
	}
	if _, err := c.Tell(ctx, cred, []byte("x")); err != nil {
		t.Errorf("Tell after the re-attachment = %v, want the participant bound", err)
	}
	ev.mu.Lock()
	nlost := len(ev.lost)
	ev.mu.Unlock()
	if nlost != 0 {
		t.Errorf("OnLost called %d times, want 0", nlost)
	}
	sent := attachesIn(srv, 1)
	if len(sent) != 2 {
		t.Fatalf("the server saw %d attaches, want 2 (the expired token, its renewal)", len(sent))
	}
	if sent[0].Token == sent[1].Token {
		t.Errorf("the retry reused token %v, want a new one", sent[1].Token)
	}
	for i, a := range sent {
		if a.Generation != cred.Generation || a.Secret != cred.Secret {
			t.Errorf("attach %d presented generation %d, want the held credential's %d", i, a.Generation, cred.Generation)
		}
	}
	want := []seenIntent{
		{client.Intent{Op: client.IntentAttach, Conversation: 1, Presented: cred, Token: client.Token(sent[0].Token)}, false},
		{client.Intent{Op: client.IntentAttach, Conversation: 1, Presented: cred, Token: client.Token(sent[1].Token)}, false},
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(want, intents, cmp.AllowUnexported(seenIntent{})); diff != "" {
		t.Errorf("OnIntent calls (-want +got):\n%s", diff)
	}
	if got := c.Welcome().Connection; got != conn {
		t.Errorf("connection %d, want %d", got, conn)
	}
}

// When the expired token of a re-attachment had committed (the server
// forgot it), the retry with a new token presents a generation that is no
// longer current: it is refused stale_authority and the participant is
// lost, never attached twice.
func TestClient_Reattach_TokenExpiredThenStaleAuthority_ParticipantLost(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	c := dialT(t, srv, ev.options())
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	expireFirstAttach(srv, 1, true)
	srv.dropAll()
	ev.waitFor(t, "lost p"+itoa(cred.Participant)+" g1", "reconnect")
	ev.mu.Lock()
	reasons := append([]error(nil), ev.lost...)
	ev.mu.Unlock()
	if len(reasons) != 1 || !errors.Is(reasons[0], client.ErrParticipantLost) || !errors.Is(reasons[0], client.ErrStaleAuthority) {
		t.Errorf("OnLost reasons = %v, want one participant lost by stale_authority", reasons)
	}
	if _, err := c.Tell(ctx, cred, []byte("x")); !errors.Is(err, client.ErrParticipantLost) {
		t.Errorf("Tell of the lost participant = %v, want participant lost", err)
	}
	sent := attachesIn(srv, 1)
	if len(sent) != 2 || sent[0].Token == sent[1].Token {
		t.Fatalf("the server saw attaches %v, want two with different tokens", sent)
	}
	if got := srv.member(1, cred.Participant).gen; got != 2 {
		t.Errorf("the participant's generation is %d, want 2: attached once", got)
	}
}

// An explicit Attach whose own token expired is retried once with a new
// token; one whose token the caller supplied (WithToken) is not: the
// caller owns that token's meaning, and gets token_expired.
func TestClient_Attach_TokenExpired(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []client.CallOption
		wantErr error
		sends   int
	}{
		{"drawn by the client", nil, nil, 2},
		{"WithToken", []client.CallOption{client.WithToken(client.NewToken())}, client.ErrTokenExpired, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := newFakeServer(t)
			a := dialT(t, srv, client.Options{})
			cred, err := a.Enroll(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			b := dialT(t, srv, client.Options{})
			expireFirstAttach(srv, 1, false)
			got, err := b.Attach(ctx, cred, tc.opts...)
			sent := attachesIn(srv, 1)
			if len(sent) != tc.sends {
				t.Fatalf("the server saw %d attaches, want %d", len(sent), tc.sends)
			}
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !errors.Is(err, client.ErrParticipantLost) {
					t.Errorf("Attach = %v, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got.Generation != cred.Generation+1 {
				t.Fatalf("Attach = %v, %v; want generation %d", got, err, cred.Generation+1)
			}
			if sent[0].Token == sent[1].Token {
				t.Errorf("the retry reused token %v, want a new one", sent[1].Token)
			}
			if _, err := b.Tell(ctx, got, []byte("x")); err != nil {
				t.Errorf("Tell after the Attach = %v", err)
			}
		})
	}
}

// An OnIntent error for the token that renews an expired one stops the
// attach before that token is sent; the intent keeps it and its renewal
// spent, so the next Attach asks OnIntent again with the same token and
// sends it, and a second token_expired loses the participant.
func TestClient_Attach_TokenExpired_OnIntentFailsForTheRenewal(t *testing.T) {
	for _, expiresAgain := range []bool{false, true} {
		name := "renewal commits"
		if expiresAgain {
			name = "renewal expires"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := newFakeServer(t)
			a := dialT(t, srv, client.Options{})
			cred, err := a.Enroll(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			diskFull := errors.New("disk full")
			var (
				mu     sync.Mutex
				tokens []client.Token
			)
			b := dialT(t, srv, client.Options{OnIntent: func(in client.Intent) error {
				mu.Lock()
				defer mu.Unlock()
				tokens = append(tokens, in.Token)
				if len(tokens) == 2 {
					return diskFull
				}
				return nil
			}})
			srv.mu.Lock()
			srv.refusal = wire.Error{Code: wire.CodeTokenExpired, Detail: "scripted", Oldest: ptr[uint64](1)}
			srv.mu.Unlock()
			refused := 0
			srv.setHook(func(_ *fconn, m wire.Message) action {
				if a, ok := m.(*wire.Attach); ok && a.Conversation == 1 && (refused == 0 || expiresAgain) {
					refused++
					return refuse
				}
				return pass
			})
			if _, err := b.Attach(ctx, cred); !errors.Is(err, diskFull) {
				t.Fatalf("Attach with OnIntent failing for the renewal = %v, want %v", err, diskFull)
			}
			got, err := b.Attach(ctx, cred)
			sent := attachesIn(srv, 1)
			if len(sent) != 2 {
				t.Fatalf("the server saw %d attaches, want 2 (the expired token, its renewal)", len(sent))
			}
			mu.Lock()
			want := []client.Token{client.Token(sent[0].Token), client.Token(sent[1].Token), client.Token(sent[1].Token)}
			if diff := cmp.Diff(want, tokens); diff != "" {
				t.Errorf("OnIntent tokens (-want +got):\n%s", diff)
			}
			mu.Unlock()
			if sent[0].Token == sent[1].Token {
				t.Errorf("the renewal reused token %v", sent[1].Token)
			}
			if expiresAgain {
				if !errors.Is(err, client.ErrTokenExpired) || !errors.Is(err, client.ErrParticipantLost) {
					t.Errorf("Attach after the renewal expired = %v, %v; want participant lost by token_expired", got, err)
				}
				return
			}
			if err != nil || got.Generation != cred.Generation+1 {
				t.Errorf("Attach after OnIntent recovered = %v, %v; want generation %d", got, err, cred.Generation+1)
			}
		})
	}
}

// Welcome reports the token window and skew a server announces, as
// durations, zero when it announces none, and the largest duration for a
// window too long for one; a reconnect picks up the new server's.
func TestClient_WelcomeReportsTheTokenWindow(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	reconnected := make(chan client.Welcome, 1)
	c := dialT(t, srv, client.Options{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		OnReconnect: func(w client.Welcome) { reconnected <- w }})
	if w := c.Welcome(); w.TokenWindow != 0 || w.TokenSkew != 0 {
		t.Fatalf("Welcome() without a window = %+v, want TokenWindow and TokenSkew 0", w)
	}
	for _, tc := range []struct {
		name         string
		window, skew uint64
		want         client.Welcome
	}{
		{"an hour and a minute", 3_600_000, 60_000, client.Welcome{TokenWindow: time.Hour, TokenSkew: time.Minute}},
		{"zero long", 0, 1, client.Welcome{TokenSkew: time.Millisecond}},
		{"beyond a Duration", 1 << 63, 1<<64 - 1, client.Welcome{TokenWindow: 1<<63 - 1, TokenSkew: 1<<63 - 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.setTokenWindow(&tc.window, &tc.skew)
			srv.dropAll()
			var w client.Welcome
			select {
			case w = <-reconnected:
			case <-ctx.Done():
				t.Fatal("no reconnect after the connection dropped")
			}
			if got := c.Welcome(); got != w {
				t.Errorf("Welcome() = %+v after the reconnect, OnReconnect had %+v", got, w)
			}
			if diff := cmp.Diff(tc.want, w, cmpopts.IgnoreFields(client.Welcome{}, "Server", "Incarnation", "Connection", "MaxFrame", "MaxRecordBytes")); diff != "" {
				t.Errorf("Welcome() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
