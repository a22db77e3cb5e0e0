package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// hangingBackend is a backend whose Close waits for release, as closing a
// store on a dead disk does.
type hangingBackend struct{ release chan struct{} }

func (hangingBackend) Stats() store.Stats { return store.Stats{} }
func (b hangingBackend) Close() error     { <-b.release; return nil }

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	// +checklocks:mu
	b strings.Builder
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestCloseStore_GivesUpOnAHungClose closes a store whose Close never
// returns: closeStore returns ErrStoreHung after StoreCloseTimeout, naming
// the Close; /ready answers 503 "store failed" and participantd_store_failed
// is 1; the error-level log line says what it waited for.
func TestCloseStore_GivesUpOnAHungClose(t *testing.T) {
	logs := &syncBuffer{}
	s, err := New(Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0",
		StoreCloseTimeout: 100 * time.Millisecond, Logger: zerolog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.ln.Close()
	s.hln.Close()
	svc, err := participant.Open(context.Background(), store.NewMemory(), participant.Options{NodeKey: make([]byte, participant.NodeKeySize)})
	if err != nil {
		t.Fatal(err)
	}
	s.svc.Store(svc)
	connsDone := make(chan struct{})
	close(connsDone)
	release := make(chan struct{})
	defer close(release)

	began := time.Now()
	err = s.closeStore(connsDone, svc, hangingBackend{release})
	if !errors.Is(err, ErrStoreHung) || !strings.Contains(err.Error(), "store Close") {
		t.Fatalf("closeStore = %v, want ErrStoreHung naming the store Close", err)
	}
	if took := time.Since(began); took < s.cfg.StoreCloseTimeout {
		t.Errorf("closeStore gave up after %v, before store-close-timeout %v", took, s.cfg.StoreCloseTimeout)
	}

	h := s.healthHandler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ready", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "store failed") {
		t.Errorf("/ready after giving up = %d %q, want 503 store failed", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/metrics", nil))
	if !strings.Contains(rec.Body.String(), "\n"+MetricStoreFailed+" 1\n") {
		t.Errorf("/metrics after giving up lacks %s 1", MetricStoreFailed)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"message":"the store stopped answering`) {
			line = l
		}
	}
	for _, want := range []string{`"level":"error"`, `"store_call":"Close"`, `"the store to close"`} {
		if !strings.Contains(line, want) {
			t.Errorf("give-up log line %q lacks %s", line, want)
		}
	}
}
