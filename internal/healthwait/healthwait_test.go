package healthwait_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/internal/healthwait"
)

// TestReady_WaitsFor200: /ready answering 503 twice, then 200.
func TestReady_WaitsFor200(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" || asked.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := healthwait.Ready(context.Background(), strings.TrimPrefix(srv.URL, "http://"), nil, time.Minute); err != nil || asked.Load() != 3 {
		t.Fatalf("Ready = %v after %d requests, want nil after 3", err, asked.Load())
	}
}

// TestReady_ExitedEndedOrTimedOut: a process that exited, a context that
// ended and a timeout each end the wait with their own error.
func TestReady_ExitedEndedOrTimedOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there
	ctx := context.Background()
	exited := make(chan struct{})
	close(exited)
	if err := healthwait.Ready(ctx, addr, exited, time.Minute); !errors.Is(err, healthwait.ErrExited) {
		t.Errorf("an exited process: Ready = %v, want ErrExited", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := healthwait.Ready(cctx, addr, nil, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("an ended context: Ready = %v, want context.Canceled", err)
	}
	if err := healthwait.Ready(ctx, addr, nil, 100*time.Millisecond); err == nil || errors.Is(err, healthwait.ErrExited) || errors.Is(err, context.Canceled) {
		t.Errorf("nothing ready: Ready = %v, want a timeout", err)
	}
}
