package servertest

import (
	"context"
	"sync"
	"testing"

	"github.com/participantd/participantd/server"
)

// loopback is the listen address used when a Config leaves one empty.
const loopback = "127.0.0.1:0"

// Server is a participantd running in process for one test. The embedded
// *server.Server gives its addresses.
type Server struct {
	*server.Server

	t      testing.TB
	cancel context.CancelFunc
	done   chan error // receives Run's error once

	once sync.Once
	err  error // Run's error, set by the first Stop
}

// Start runs a server with cfg until the end of the test and returns it
// once it is ready. It fails the test (t.Fatalf) when server.New fails or
// Run returns before the server is ready. It must be called from the
// test's goroutine.
func Start(t testing.TB, cfg server.Config) *Server {
	t.Helper()
	s, err := TryStart(t, cfg)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	return s
}

// TryStart is Start for callers that handle a failed start themselves
// (for example to retry a bind): it returns server.New's error, or Run's
// when Run returns before the server is ready, instead of failing the
// test. On success the server is stopped at the end of the test.
func TryStart(t testing.TB, cfg server.Config) (*Server, error) {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = loopback
	}
	if cfg.HealthListen == "" {
		cfg.HealthListen = loopback
	}
	srv, err := server.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		cancel()
		return nil, err
	}
	s := &Server{Server: srv, t: t, cancel: cancel, done: done}
	t.Cleanup(func() { s.Stop() })
	return s, nil
}

// Stop cancels the server's Run and waits for it to return. The first call
// reports a non-nil error from Run with t.Errorf; every call returns that
// error. Stop is idempotent and safe to call from any goroutine.
func (s *Server) Stop() error {
	s.once.Do(func() {
		s.cancel()
		s.err = <-s.done
		if s.err != nil {
			s.t.Errorf("server Run = %v", s.err)
		}
	})
	return s.err
}
