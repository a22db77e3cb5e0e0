package healthwait_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/internal/healthwait"
)

// TestReady answers nil once /ready says 200, ErrExited for a process that
// exited, the context's error once it ends, and a timeout's error.
func TestReady(t *testing.T) {
	var ok atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" || !ok.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()

	exited := make(chan struct{})
	close(exited)
	if err := healthwait.Ready(ctx, addr, exited, time.Minute); !errors.Is(err, healthwait.ErrExited) {
		t.Errorf("an exited process not ready: Ready = %v, want ErrExited", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := healthwait.Ready(cctx, addr, nil, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("an ended context: Ready = %v, want context.Canceled", err)
	}
	if err := healthwait.Ready(ctx, addr, nil, 50*time.Millisecond); err == nil || errors.Is(err, healthwait.ErrExited) {
		t.Errorf("never ready: Ready = %v, want a timeout's error", err)
	}
	ok.Store(true)
	if err := healthwait.Ready(ctx, addr, nil, time.Minute); err != nil {
		t.Errorf("ready: Ready = %v, want nil", err)
	}
}
