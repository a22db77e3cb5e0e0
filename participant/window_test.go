package participant

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/tokenindex"
)

// v7Token returns a UUIDv7 token drawn at unix ms ms, its random part n.
func v7Token(ms int64, n uint64) Token {
	var t Token
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(ms))
	copy(t[:6], b[2:])
	binary.BigEndian.PutUint64(t[8:], n)
	t[6] = 0x70 | byte(n>>60)&0x0f
	t[8] = 0x80 | t[8]&0x3f
	return t
}

func TestTokenTime(t *testing.T) {
	ms := int64(1_700_000_123_456)
	if got, ok := tokenTime(v7Token(ms, 42)); !ok || got != ms {
		t.Fatalf("tokenTime(v7 at %d) = %d, %v", ms, got, ok)
	}
	v4 := v7Token(ms, 42)
	v4[6] = 0x40 | v4[6]&0x0f
	if _, ok := tokenTime(v4); ok {
		t.Fatalf("tokenTime(a version 4 token) reports a UUIDv7")
	}
	badVariant := v7Token(ms, 42)
	badVariant[8] &= 0x3f
	if _, ok := tokenTime(badVariant); ok {
		t.Fatalf("tokenTime(a v7 token of another variant) reports a UUIDv7")
	}
}

func codeOf(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// TestTokenWindow_Admission: under a window, a token not committed is
// refused unless it is a UUIDv7 within [now-window, now+skew]; a refusal
// writes nothing; a committed token replays whatever its age; and the
// token comes first in the order of checks (an unknown participant's
// expired token is token_expired).
func TestTokenWindow_Admission(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	svc, err := Open(ctx, mem, Options{NodeKey: testKey, TokenWindow: time.Hour, TokenSkew: time.Minute, Now: clk.Now})
	must(t, err)
	defer svc.Close()
	c := svc.Connect(nil)
	now := clk.now.UnixMilli()
	enrollTok := v7Token(now-30*60_000, 1)
	b, err := c.Enroll(ctx, Enroll{Conversation: 1, Token: enrollTok})
	must(t, err)
	rows := oplogLen(t, mem, 1)

	tests := []struct {
		name string
		tok  Token
		p    ParticipantID
		want Error
	}{
		{"not a UUIDv7", token(0x42), b.Participant, Error{Code: CodeTokenInvalid}},
		{"ahead of the clock by more than the skew", v7Token(now+2*60_000, 2), b.Participant, Error{Code: CodeTokenInvalid, Newest: now + 60_000}},
		{"older than the window", v7Token(now-2*3_600_000, 3), b.Participant, Error{Code: CodeTokenExpired, Oldest: now - 3_600_000}},
		{"older than the window, unknown participant", v7Token(now-2*3_600_000, 4), 99, Error{Code: CodeTokenExpired, Oldest: now - 3_600_000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Tell(ctx, Tell{Conversation: 1, Participant: tt.p, Generation: 1, Token: tt.tok, Payload: []byte("x")})
			pe := codeOf(err)
			if pe == nil {
				t.Fatalf("Tell = %v, want %s", err, tt.want.Code)
			}
			got := Error{Code: pe.Code, Oldest: pe.Oldest, Newest: pe.Newest}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(Error{})); diff != "" {
				t.Fatalf("Tell refusal (-want +got):\n%s", diff)
			}
			if n := oplogLen(t, mem, 1); n != rows {
				t.Fatalf("a refused tell changed the oplog: %d rows, want %d", n, rows)
			}
		})
	}
	_, err = c.Enroll(ctx, Enroll{Conversation: 2, Token: token(7)})
	if pe := codeOf(err); pe == nil || pe.Code != CodeTokenInvalid {
		t.Fatalf("Enroll with a random token = %v, want token_invalid", err)
	}

	// Within the window and the skew: commits.
	told, err := c.Tell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: 1, Token: v7Token(now+30_000, 5), Payload: []byte("x")})
	must(t, err)
	// Long after, while the index still holds them, both replay.
	clk.advance(3 * time.Hour)
	again, err := c.Tell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: 1, Token: v7Token(now+30_000, 5), Payload: []byte("x")})
	if err != nil || again.Seq != told.Seq || again.Replay != ReplayCommitted {
		t.Fatalf("retry of a committed tell past the window = %+v, %v, want seq %v replayed", again, err, told.Seq)
	}
	rb, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: 1, Token: enrollTok})
	if err != nil || rb.Participant != b.Participant || rb.Replay == ReplayNone {
		t.Fatalf("retry of a committed enroll past the window = %+v, %v, want a replay", rb, err)
	}
}

// windowHistory enrolls a sender and a reader in conv with tokens drawn
// at the clock, tells n records, the reader acknowledging each, and
// returns the tell requests.
func windowHistory(t *testing.T, svc *Service, clk *clock, conv ConversationID, n int) []Tell {
	t.Helper()
	return buildHistoryTokens(t, svc, conv, n, 0, func(i int) Token {
		return v7Token(clk.Now().UnixMilli(), uint64(100+i))
	}).tells
}

// TestTokenWindow_CompactionForgetsOldTokens: compaction under a window
// deletes the index entries of the trimmed rows' tokens and writes no
// receipts for them, after persisting the floor; a retry of a forgotten
// token is token_expired and commits nothing, after a restart, after the
// clock went back an hour, and on a service opened without a window.
// Tokens from before the window (not UUIDv7) keep their receipts and
// replay.
func TestTokenWindow_CompactionForgetsOldTokens(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()

	// History from before the window was set, in conversation 1: random
	// tokens. Conversation 2 gets its history under the window.
	plain := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Minute, Now: clk.Now}
	svc, err := Open(ctx, mem, plain)
	must(t, err)
	h := buildHistory(t, svc, 1, 10, 0)
	must(t, svc.Close())

	opts := plain
	opts.TokenWindow, opts.TokenSkew = time.Minute, 10*time.Second
	svc, err = Open(ctx, mem, opts)
	must(t, err)
	tells := windowHistory(t, svc, clk, 2, 20)
	if _, err := svc.CheckpointPass(ctx); err != nil {
		t.Fatal(err)
	}
	// Past retain, but not past window+skew: nothing is trimmed yet, since
	// the trimmed tokens must all be forgettable.
	clk.advance(65 * time.Second)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	if got.OplogRows != 0 {
		t.Fatalf("CompactPass() before window+skew = %+v, want nothing trimmed", got)
	}
	clk.advance(10 * time.Second)
	got, err = svc.CompactPass(ctx)
	must(t, err)
	if got.OplogRows == 0 || got.Forgotten != 22 || got.Receipts != 12 {
		t.Fatalf("CompactPass() = %+v, want rows trimmed, 22 tokens forgotten (2 enrolls, 20 tells), 12 receipts (the tokens from before the window)", got)
	}
	floor, err := mem.ReadValue(tokenindex.FloorKey(2))
	must(t, err)
	// Just past the newest token forgotten, not now minus the window.
	var newest int64
	for _, req := range tells {
		ms, _ := tokenTime(req.Token)
		newest = max(newest, ms)
	}
	if int64(floor) != newest+1 {
		t.Fatalf("persisted floor = %d, want %d, just past the newest token forgotten", floor, newest+1)
	}
	for _, req := range tells {
		if v, err := mem.ReadValue(tokenindex.Key(2, tokenindex.Participant(req.Participant), req.Token)); err != nil || v != 0 {
			t.Fatalf("the index entry of a forgotten token = %d, %v, want deleted", v, err)
		}
	}
	check := func(name string, svc *Service) {
		t.Helper()
		c := svc.Connect(nil)
		rows := oplogLen(t, mem, 2)
		for _, req := range tells {
			_, err := c.Tell(ctx, req)
			if pe := codeOf(err); pe == nil || pe.Code != CodeTokenExpired {
				t.Fatalf("%s: retry of a forgotten tell = %v, want token_expired", name, err)
			}
		}
		if n := oplogLen(t, mem, 2); n != rows {
			t.Fatalf("%s: retries of forgotten tokens committed: %d oplog rows, want %d", name, n, rows)
		}
		// The tokens from before the window replay from their receipts.
		for i := range 10 {
			req := Tell{Conversation: 1, Participant: h.sender.Participant, Generation: 1,
				Token: benchToken(1, uint64(i)), Payload: []byte(fmt.Sprintf("tell %d of %v", i, ConversationID(1)))}
			told, err := c.Tell(ctx, req)
			if err != nil || told.Replay != ReplayCommitted || told.Seq != Seq(3+i) {
				t.Fatalf("%s: retry of pre-window tell %d = %+v, %v, want seq %d replayed", name, i, told, err, 3+i)
			}
		}
	}
	check("same service", svc)
	must(t, svc.Close())

	svc, err = Open(ctx, mem, opts)
	must(t, err)
	check("after a restart", svc)
	must(t, svc.Close())

	clk.advance(-time.Hour)
	svc, err = Open(ctx, mem, opts)
	must(t, err)
	check("with the clock an hour back", svc)
	must(t, svc.Close())

	svc, err = Open(ctx, mem, plain)
	must(t, err)
	defer svc.Close()
	check("without a window", svc)
	// Without a window, a random token is a new operation as before.
	c := svc.Connect(nil)
	b, err := c.Attach(ctx, Attach{Conversation: 1, Participant: h.sender.Participant, Generation: 1, Secret: h.sender.Secret, Token: token(0x99)})
	if err != nil {
		// The sender attached since (windowHistory enrolled others):
		// generation 1 is still its current one, so this must commit.
		t.Fatalf("attach with a random token without a window = %v", err)
	}
	if _, err := c.Tell(ctx, Tell{Conversation: 1, Participant: b.Participant, Generation: b.Generation, Token: token(0x9a), Payload: []byte("y")}); err != nil {
		t.Fatalf("tell with a random token without a window = %v", err)
	}
}

// TestTokenWindow_OfflineCompactForgets: participantctl compact's
// Compact, given the daemon's window, forgets tokens as the background
// passes do: its first run checkpoints (a mark now), a run past
// window+skew later trims and forgets, and the retries are token_expired.
func TestTokenWindow_OfflineCompactForgets(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, Retain: time.Nanosecond, TokenWindow: time.Minute, TokenSkew: time.Second, Now: clk.Now}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	tells := windowHistory(t, svc, clk, 1, 10)
	must(t, svc.Close())

	rep, err := Compact(ctx, mem, opts)
	must(t, err)
	if rep.Checkpoints != 1 || rep.Compacted.OplogRows != 0 {
		t.Fatalf("Compact at once = %+v, want a checkpoint and nothing trimmed (its mark is not window+skew old)", rep)
	}
	clk.advance(2 * time.Minute)
	rep, err = Compact(ctx, mem, opts)
	must(t, err)
	if rep.Compacted.OplogRows == 0 || rep.Compacted.Forgotten != 12 || rep.Compacted.Receipts != 0 {
		t.Fatalf("Compact past window+skew = %+v, want rows trimmed and 12 tokens forgotten (2 enrolls, 10 tells), no receipt", rep.Compacted)
	}
	svc, err = Open(ctx, mem, opts)
	must(t, err)
	defer svc.Close()
	c := svc.Connect(nil)
	for _, req := range tells {
		if _, err := c.Tell(ctx, req); !errors.Is(err, ErrTokenExpired) {
			t.Fatalf("retry of a tell forgotten offline = %v, want token_expired", err)
		}
	}
}

// TestTokenWindow_ClockStepAheadNeverLocksTheConversation is issue 17's
// failure 14: while the clock is an hour ahead, a compaction pass forgets
// the tokens it trims; once the clock is corrected, a fresh token must
// commit, with the window and without it: the floor went just past the
// newest token forgotten, not to the wrong clock's now minus the window.
// The forgotten tokens stay token_expired.
func TestTokenWindow_ClockStepAheadNeverLocksTheConversation(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.UnixMilli(1_700_000_000_000)}
	mem := store.NewMemory()
	opts := Options{NodeKey: testKey, CheckpointRows: 1, Retain: time.Second, TokenWindow: time.Minute, TokenSkew: time.Second, Now: clk.Now}
	svc, err := Open(ctx, mem, opts)
	must(t, err)
	h := buildHistoryTokens(t, svc, 1, 10, 0, func(i int) Token { return v7Token(clk.Now().UnixMilli(), uint64(100+i)) })
	if _, err := svc.CheckpointPass(ctx); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	got, err := svc.CompactPass(ctx)
	must(t, err)
	if got.Forgotten == 0 {
		t.Fatalf("CompactPass() with the clock an hour ahead = %+v, want tokens forgotten", got)
	}
	must(t, svc.Close())
	clk.advance(-time.Hour + 2*time.Minute)

	for i, o := range []Options{opts, {NodeKey: testKey, Now: clk.Now}} {
		svc, err := Open(ctx, mem, o)
		must(t, err)
		c := svc.Connect(nil)
		b, err := c.Attach(ctx, Attach{Conversation: 1, Participant: h.sender.Participant, Generation: h.sender.Generation,
			Secret: h.sender.Secret, Token: v7Token(clk.Now().UnixMilli(), uint64(200+i))})
		if err != nil {
			t.Fatalf("window %v: attach with a fresh token after the clock was corrected = %v, want it committed", o.TokenWindow, err)
		}
		h.sender = b
		if _, err := c.Tell(ctx, h.tells[0]); !errors.Is(err, ErrTokenExpired) {
			t.Fatalf("window %v: retry of a forgotten tell = %v, want token_expired", o.TokenWindow, err)
		}
		must(t, svc.Close())
	}
}
