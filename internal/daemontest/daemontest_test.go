package daemontest_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/internal/daemontest"
)

// TestWaitReady_WaitsFor200: /ready answering 503 twice, then 200.
func TestWaitReady_WaitsFor200(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" || asked.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if err := daemontest.WaitReady(strings.TrimPrefix(srv.URL, "http://"), nil, time.Minute); err != nil || asked.Load() != 3 {
		t.Fatalf("WaitReady = %v after %d requests, want nil after 3", err, asked.Load())
	}
}

func TestWaitReady_ExitedOrTimedOut(t *testing.T) {
	addr := daemontest.FreeAddr(t) // nothing listens there
	exited := make(chan struct{})
	close(exited)
	if err := daemontest.WaitReady(addr, exited, time.Minute); !errors.Is(err, daemontest.ErrExited) {
		t.Errorf("an exited process: WaitReady = %v, want ErrExited", err)
	}
	if err := daemontest.WaitReady(addr, nil, 100*time.Millisecond); err == nil || errors.Is(err, daemontest.ErrExited) {
		t.Errorf("nothing ready: WaitReady = %v, want a timeout", err)
	}
}
