package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestReady_BodySaysWhy walks a server through the states /ready
// distinguishes without a cluster: starting, ready, draining, and a store
// given up on. Each answer is the JSON Readiness with the matching status.
func TestReady_BodySaysWhy(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	s.ln.Close()
	s.hln.Close()
	h := s.healthHandler()
	check := func(state string, wantCode int, want Readiness) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ready", nil))
		var got Readiness
		dec := json.NewDecoder(strings.NewReader(rec.Body.String()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s: /ready body %q is not a Readiness: %v", state, rec.Body.String(), err)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: /ready Content-Type %q, want application/json", state, ct)
		}
		if rec.Code != wantCode || got.Ready != want.Ready || !strings.HasPrefix(got.Reason, want.Reason) || (want.Reason == "") != (got.Reason == "") {
			t.Errorf("%s: /ready = %d %+v, want %d %+v", state, rec.Code, got, wantCode, want)
		}
	}

	check("before the store is open", 503, Readiness{Reason: ReasonStarting})
	s.etcdWaiting.Store(&etcdWait{endpoint: "http://127.0.0.1:1", err: "connect: connection refused", detail: "etcd http://127.0.0.1:1: connect: connection refused"})
	check("waiting for etcd", 503, Readiness{Reason: ReasonWaitingForEtcd + ": etcd http://127.0.0.1:1: connect: connection refused"})
	s.etcdWaiting.Store(nil)
	s.ready.Store(true)
	close(s.readyCh)
	check("serving", 200, Readiness{Ready: true})
	s.ready.Store(false)
	check("draining", 503, Readiness{Reason: ReasonDraining})
	s.hung.Store(true)
	check("store given up on", 503, Readiness{Reason: ReasonStoreFailed + ": " + ErrStoreHung.Error()})
}
