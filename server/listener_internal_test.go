package server

import (
	"context"
	"net"
	"testing"
	"time"
)

// A wire listener closed under the server (not by a drain) ends its accept
// loop with no error; Run drains and returns instead of waiting for that
// loop a second time. The same holds for the WebSocket listener.
func TestRun_ListenerClosedUnderItDrainsAndReturns(t *testing.T) {
	for _, tc := range []struct {
		name string
		ln   func(*Server) net.Listener
	}{
		{"wire", func(s *Server) net.Listener { return s.ln }},
		{"WebSocket", func(s *Server) net.Listener { return s.wsln }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0", WSListen: "127.0.0.1:0"})
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
			tc.ln(srv).Close()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run after its %s listener closed = %v, want nil", tc.name, err)
				}
			case <-time.After(time.Minute): // a hang detector, not a timing claim
				t.Fatalf("Run did not return after its %s listener was closed", tc.name)
			}
		})
	}
}
