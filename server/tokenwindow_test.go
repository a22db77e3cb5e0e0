package server_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	pclient "github.com/participantd/participantd/client"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// v7 returns a UUIDv7 token drawn at at, its other bits random.
func v7(at time.Time) wire.Token {
	var r [10]byte
	rand.Read(r[:])
	return wire.TokenV7(at.UnixMilli(), binary.BigEndian.Uint16(r[:2]), binary.BigEndian.Uint64(r[2:]))
}

// notV7 returns a random token that is not a UUIDv7 (a version 4 UUID).
func notV7() wire.Token {
	t := token()
	t[6] = 0x40 | t[6]&0x0f
	t[8] = 0x80 | t[8]&0x3f
	return t
}

// within fails unless *got (unix ms) is in [lo, hi] of the clock's ms.
func within(t *testing.T, what string, got *uint64, lo, hi time.Time) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s absent, want a unix ms in [%d, %d]", what, lo.UnixMilli(), hi.UnixMilli())
	}
	if ms := int64(*got); ms < lo.UnixMilli() || ms > hi.UnixMilli() {
		t.Fatalf("%s = %d, want in [%d, %d]", what, ms, lo.UnixMilli(), hi.UnixMilli())
	}
}

// A server run with a token window, through its TCP listener: tokens the
// Go client draws are accepted; a token that is not a UUIDv7 is
// token_invalid without newest, one older than the window token_expired
// with oldest = now - window, one ahead of the clock past the skew
// token_invalid with newest = now + skew; nothing is done for any of
// them, and the connection keeps serving after each.
func TestTokenWindow_EndToEnd(t *testing.T) {
	const window = time.Hour
	skew := participant.DefaultTokenSkew
	h := start(t, server.Config{TokenWindow: window})

	t.Run("the Go client's tokens", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		c, err := pclient.Dial(ctx, h.srv.Addr().String(), pclient.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cred, err := c.Enroll(ctx, 1)
		if err != nil {
			t.Fatalf("Enroll = %v", err)
		}
		seq, err := c.Tell(ctx, cred, []byte("fine"))
		if err != nil {
			t.Fatalf("Tell = %v", err)
		}
		// The refusals reach the caller typed, with their extras, once.
		before := time.Now()
		_, err = c.Tell(ctx, cred, []byte("old"), pclient.WithToken(v7(before.Add(-2*window))))
		var ce *pclient.Error
		if !errors.Is(err, pclient.ErrTokenExpired) || !errors.As(err, &ce) {
			t.Fatalf("Tell with a token 2 windows old = %v, want token_expired", err)
		}
		within(t, "token_expired oldest", ce.Oldest, before.Add(-window), time.Now().Add(-window))
		_, err = c.Tell(ctx, cred, []byte("v4"), pclient.WithToken(notV7()))
		if !errors.Is(err, pclient.ErrTokenInvalid) || !errors.As(err, &ce) || ce.Newest != nil {
			t.Fatalf("Tell with a version 4 token = %v, want token_invalid without newest", err)
		}
		next, err := c.Tell(ctx, cred, []byte("still fine"))
		if err != nil || next != seq+1 {
			t.Fatalf("Tell after the refusals = %d, %v; want seq %d: a refusal did something", next, err, seq+1)
		}
	})

	t.Run("raw wire", func(t *testing.T) {
		c := h.dial()
		a := c.call(&wire.Enroll{ID: c.id(), Conversation: 2, Token: v7(time.Now())})
		e, ok := a.(*wire.Enrolled)
		if !ok {
			t.Fatalf("enroll with a UUIDv7 of now answered %#v", a)
		}
		cr := cred{2, e.Participant, e.Generation, e.Secret}
		last := c.call(&wire.Tell{ID: c.id(), Conversation: 2, Participant: cr.p, Generation: cr.gen, Token: v7(time.Now()), Payload: []byte("x")})
		told, ok := last.(*wire.Told)
		if !ok {
			t.Fatalf("tell with a UUIDv7 of now answered %#v", last)
		}
		seq := told.Seq

		for _, tc := range []struct {
			name  string
			token func(now time.Time) wire.Token
			check func(t *testing.T, what string, e *wire.Error, before, after time.Time)
		}{
			{"not a UUIDv7", func(time.Time) wire.Token { return notV7() }, func(t *testing.T, what string, e *wire.Error, _, _ time.Time) {
				if e.Code != wire.CodeTokenInvalid || e.Newest != nil || e.Oldest != nil {
					t.Fatalf("%s answered %#v, want token_invalid without newest", what, e)
				}
			}},
			{"two windows old", func(now time.Time) wire.Token { return v7(now.Add(-2 * window)) }, func(t *testing.T, what string, e *wire.Error, before, after time.Time) {
				if e.Code != wire.CodeTokenExpired || e.Newest != nil {
					t.Fatalf("%s answered %#v, want token_expired", what, e)
				}
				within(t, what+": oldest", e.Oldest, before.Add(-window), after.Add(-window))
			}},
			{"ten minutes ahead", func(now time.Time) wire.Token { return v7(now.Add(10 * time.Minute)) }, func(t *testing.T, what string, e *wire.Error, before, after time.Time) {
				if e.Code != wire.CodeTokenInvalid || e.Oldest != nil {
					t.Fatalf("%s answered %#v, want token_invalid", what, e)
				}
				within(t, what+": newest", e.Newest, before.Add(skew), after.Add(skew))
			}},
		} {
			for _, req := range []func(tok wire.Token) wire.Message{
				func(tok wire.Token) wire.Message {
					return &wire.Tell{ID: c.id(), Conversation: 2, Participant: cr.p, Generation: cr.gen, Token: tok, Payload: []byte("refused")}
				},
				func(tok wire.Token) wire.Message { return &wire.Enroll{ID: c.id(), Conversation: 2, Token: tok} },
				func(tok wire.Token) wire.Message {
					return &wire.Detach{ID: c.id(), Conversation: 2, Participant: cr.p, Generation: cr.gen, Token: tok}
				},
			} {
				before := time.Now()
				m := req(tc.token(before))
				a := c.call(m)
				after := time.Now()
				e, ok := a.(*wire.Error)
				if !ok {
					t.Fatalf("%s, %s answered %#v, want an error", tc.name, m.Type(), a)
				}
				tc.check(t, tc.name+", "+m.Type(), e, before, after)
				// The connection still serves, and nothing was done:
				// the next tell is the next seq.
				c.ping()
				a = c.call(&wire.Tell{ID: c.id(), Conversation: 2, Participant: cr.p, Generation: cr.gen, Token: v7(time.Now()), Payload: []byte("after")})
				if told, ok := a.(*wire.Told); !ok || told.Seq != seq+1 {
					t.Fatalf("%s: tell after the refused %s answered %#v, want seq %d", tc.name, m.Type(), a, seq+1)
				}
				seq++
			}
		}
	})
}
