package client_test

import (
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/wire"
)

// daemon runs the real server in process on dir at listen.
func daemon(t *testing.T, dir, listen string) (addr string, stop func()) {
	t.Helper()
	srv := servertest.Start(t, server.Config{DataDir: dir, Listen: listen})
	return srv.Addr().String(), func() { srv.Stop() }
}

func TestIntegration_RestartReattachesAndResumes(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	addr, stop := daemon(t, dir, "127.0.0.1:0")
	opts := client.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	a, err := client.Dial(ctx, addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := client.Dial(ctx, addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	inc := a.Welcome().Incarnation
	ca, err := a.Enroll(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Enroll(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := a.Tell(ctx, ca, []byte("before"))
	if err != nil {
		t.Fatal(err)
	}
	if d := next(t, b); d.Seq != s1 || string(d.Payload) != "before" {
		t.Fatalf("b got %+v, want record %d", d, s1)
	}

	// A restart: both clients reconnect and re-attach with their latest
	// credential; b's unacknowledged record is re-offered but deduplicated.
	stop()
	_, stop = daemon(t, dir, addr)
	defer stop()
	s2, err := a.Tell(ctx, ca, []byte("after"))
	if err != nil {
		t.Fatalf("Tell after restart = %v", err)
	}
	for {
		d := next(t, b)
		if d.Seq == s1 {
			t.Fatalf("record %d delivered twice", s1)
		}
		if d.Kind == wire.KindRecord {
			if d.Seq != s2 || string(d.Payload) != "after" {
				t.Fatalf("b got %+v, want record %d", d, s2)
			}
			break
		}
	}
	if got := a.Welcome().Incarnation; got != inc+1 {
		t.Errorf("incarnation after restart = %d, want %d", got, inc+1)
	}
	if cred, _ := a.Credential(7, ca.Participant); cred.Generation != 2 {
		t.Errorf("a's generation after restart = %d, want 2", cred.Generation)
	}
	if _, err := b.Ack(ctx, cb, s2); err != nil {
		t.Errorf("Ack(%d) = %v", s2, err)
	}
}

// A real server reports its token window through Welcome, and one run
// without a window reports none.
func TestIntegration_WelcomeReportsTheTokenWindow(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		name         string
		cfg          server.Config
		window, skew time.Duration
	}{
		{"without a window", server.Config{}, 0, 0},
		{"with a window", server.Config{TokenWindow: time.Hour, TokenSkew: 30 * time.Second}, time.Hour, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir, tc.cfg.Listen = t.TempDir(), "127.0.0.1:0"
			srv := servertest.Start(t, tc.cfg)
			c, err := client.Dial(ctx, srv.Addr().String(), client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if w := c.Welcome(); w.TokenWindow != tc.window || w.TokenSkew != tc.skew {
				t.Errorf("Welcome() = %+v, want TokenWindow %v, TokenSkew %v", w, tc.window, tc.skew)
			}
		})
	}
}
