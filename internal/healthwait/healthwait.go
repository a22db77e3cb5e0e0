// Package healthwait waits for a participantd process to be ready: what a
// test that runs the binary (internal/daemontest) and participantbench,
// which starts one to measure it, both need.
package healthwait

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrExited reports a process that exited before it was ready.
var ErrExited = errors.New("the process exited before it was ready")

// Ready polls GET /ready of the health listener at addr until it answers
// 200 (nil), exited is closed (ErrExited; a nil exited is never closed),
// timeout passes, or ctx ends (its error).
func Ready(ctx context.Context, addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	hc := &http.Client{Timeout: time.Second}
	for {
		if ready(ctx, hc, addr) {
			return nil
		}
		select {
		case <-exited:
			return ErrExited
		case <-deadline.C:
			return fmt.Errorf("not ready within %v", timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// ready reports whether GET /ready at addr answered 200.
func ready(ctx context.Context, hc *http.Client, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/ready", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
