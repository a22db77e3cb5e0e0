package client_test

import (
	"bytes"
	"errors"
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
	c := dialT(t, srv, client.Options{})
	cred, err := c.Enroll(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
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

// A re-attachment refused token_expired or token_invalid after a
// reconnect loses its participant, as receipt_expired does, with one try
// and without churning the new connection, which serves the rest.
func TestClient_Reattach_TokenWindowRefusal_ParticipantLost(t *testing.T) {
	for _, code := range []wire.Code{wire.CodeTokenExpired, wire.CodeTokenInvalid} {
		t.Run(string(code), func(t *testing.T) {
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
			n := 0
			for _, a := range attaches(srv) {
				if a.Conversation == 1 {
					n++
				}
			}
			if n != 1 {
				t.Errorf("the lost participant's attach was sent %d times, want 1", n)
			}
			if got := c.Welcome().Connection; got != conn {
				t.Errorf("connection %d, want %d: the refusal churned the connection", got, conn)
			}
		})
	}
}
