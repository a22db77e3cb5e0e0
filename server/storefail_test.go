package server_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// TestStoreFailure_NotReadyThenDrainAndFail fails a flush of the running
// server's store with ENOSPC, then EIO: the operation is answered in_doubt,
// /ready turns 503 and participantd_store_failed 1 while the server is
// still up, and Run, without being cancelled, drains (bye to every
// connection) and returns ErrStoreFailed wrapping the cause, the way the
// daemon exits non-zero for its supervisor to restart it.
func TestStoreFailure_NotReadyThenDrainAndFail(t *testing.T) {
	for _, cause := range []error{syscall.ENOSPC, syscall.EIO} {
		t.Run(cause.Error(), func(t *testing.T) {
			var (
				fs      *faultstore.Store
				fatals  atomic.Int64
				release = make(chan struct{})
				once    sync.Once
			)
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			logs := &lockedBuffer{}
			h := start(t, server.Config{Logger: zerolog.New(logs), WrapStore: func(st store.DurableStore) store.DurableStore {
				fs = faultstore.New(st)
				// Every store call after the failing one waits here, so
				// that the test sees the server between the failure and
				// the end of its drain.
				fs.SetObserver(func(_ faultstore.Op, a faultstore.Action, _ error) {
					if a == faultstore.Fatal && fatals.Add(1) > 1 {
						<-release
					}
				})
				return fs
			}})
			if code, _ := h.get("/ready"); code != 200 {
				t.Fatalf("/ready before the failure = %d, want 200", code)
			}
			a, b := h.dial(), h.dial()
			ca := a.enroll(1)
			b.enroll(2)

			fs.SetFatalCause(cause)
			fs.SetRules(faultstore.Once(faultstore.OnKind(faultstore.OpFlush, faultstore.Fatal)))
			m := a.call(&wire.Tell{ID: a.id(), Conversation: ca.conv, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("x")})
			if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeInDoubt {
				t.Fatalf("tell with a failing flush answered %#v, want in_doubt", m)
			}

			code, body := h.get("/ready")
			if code != 503 || !strings.Contains(body, "store failed") {
				t.Errorf("/ready after the failure = %d %q, want 503 store failed", code, body)
			}
			if _, metrics := h.get("/metrics"); !strings.Contains(metrics, server.MetricStoreFailed+" 1") ||
				!strings.Contains(metrics, server.MetricReady+" 0") {
				t.Errorf("/metrics after the failure lacks %s 1 and %s 0", server.MetricStoreFailed, server.MetricReady)
			}
			select {
			case err := <-h.done:
				t.Fatalf("Run returned %v before its drain could finish", err)
			default:
			}
			once.Do(func() { close(release) })

			var err error
			select {
			case err = <-h.done:
			case <-time.After(waitFor):
				t.Fatal("Run did not return after the store failed")
			}
			h.once.Do(func() { h.err = err })
			if !errors.Is(err, server.ErrStoreFailed) || !errors.Is(err, store.ErrFailed) || !errors.Is(err, cause) {
				t.Fatalf("Run = %v, want ErrStoreFailed wrapping store.ErrFailed and %v", err, cause)
			}
			for _, c := range []*client{a, b} {
				if bye, ok := c.next().(*wire.ServerBye); !ok || bye.Reason != wire.ByeShutdown {
					t.Fatalf("got %#v, want bye shutdown", bye)
				}
				c.expectClosed()
			}
			// Many operations met the failure (the tell, a reload, the
			// drain's endings); it is logged once, at error level.
			n := 0
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "every write is refused") {
					n++
					if !strings.Contains(line, `"level":"error"`) {
						t.Errorf("store failure logged as %s, want level error", line)
					}
				}
			}
			if n != 1 {
				t.Errorf("store failure logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}
