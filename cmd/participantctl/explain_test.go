package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/wire"
)

// The token window's refusals are told in the user's terms, with the bound
// the server sent as a time, and still match their sentinels.
func TestExplain_TokenWindowRefusals(t *testing.T) {
	ms := func(v uint64) *uint64 { return &v }
	a := about{cred: client.Credential{Conversation: 4, Participant: 2, Generation: 1}, creds: "alice.json"}
	for _, c := range []struct {
		name     string
		err      *client.Error
		sentinel error
		want     []string
	}{
		{"expired", &client.Error{Code: client.CodeTokenExpired, Oldest: ms(1767225600000)}, client.ErrTokenExpired,
			[]string{"older than the server's token window", "2026-01-01T00:00:00.000Z", "only if you know the first attempt was not done", "[token_expired]"}},
		{"ahead", &client.Error{Code: client.CodeTokenInvalid, Newest: ms(1767225660000)}, client.ErrTokenInvalid,
			[]string{"ahead of the server's clock", "2026-01-01T00:01:00.000Z", "[token_invalid]"}},
		{"not a UUIDv7", &client.Error{Code: client.CodeTokenInvalid}, client.ErrTokenInvalid,
			[]string{"only UUIDv7 tokens", "alice.json", "[token_invalid]"}},
		{"rate limited", &client.Error{Code: client.CodeRateLimited, Limit: ms(100)}, client.ErrRateLimited,
			[]string{"creates conversations faster", "run it again later", "(burst 100)", "[rate_limited]"}},
	} {
		err := explain(c.err, a)
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: explain = %q, want it to contain %q", c.name, err, w)
			}
		}
		if !errors.Is(err, c.sentinel) {
			t.Errorf("%s: explain = %v, does not match %v", c.name, err, c.sentinel)
		}
	}
}

// Against a server run with a token window, participantctl's own tokens
// commit, and a --token that is not a UUIDv7, or one drawn two windows
// ago, is refused with the explanation and the code.
func TestOnline_TokenWindow(t *testing.T) {
	ctx := testCtx(t)
	const window = time.Hour
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir(), TokenWindow: window})
	addr := srv.Addr().String()
	creds := filepath.Join(t.TempDir(), "a.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "1", "--creds", creds)
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", creds, "fine")
	v4 := "0123456789ab4def8123456789abcdef"
	old := wire.TokenV7(time.Now().Add(-2*window).UnixMilli(), 1, 2).String()
	for _, c := range []struct{ token, want string }{
		{v4, "[token_invalid]"},
		{old, "[token_expired]"},
	} {
		_, errs, code := ctl(ctx, "", "tell", "--addr", addr, "--creds", creds, "--token", c.token, "refused")
		if code == 0 || !strings.Contains(errs, c.want) || !strings.Contains(errs, "nothing was done") {
			t.Errorf("tell --token %s = exit %d, stderr %q; want a refusal explained, ending in %s", c.token, code, errs, c.want)
		}
	}
}
