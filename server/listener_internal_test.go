package server

import (
	"context"
	"testing"
	"time"
)

// A wire listener closed under the server (not by a drain) ends its accept
// loop with no error; Run drains and returns instead of waiting for that
// loop a second time.
func TestRun_ListenerClosedUnderItDrainsAndReturns(t *testing.T) {
	srv, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before ready", err)
	}
	srv.ln.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after its listener closed = %v, want nil", err)
		}
	case <-time.After(time.Minute): // a hang detector, not a timing claim
		t.Fatal("Run did not return after its listener was closed")
	}
}
