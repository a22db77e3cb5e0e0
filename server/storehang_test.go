package server_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// TestShutdown_HungFlushIsBounded drains a server whose store's flush
// never returns (a dead disk, a hung NFS mount): the client whose tell is
// stuck in the flush has its connection closed when the drain times out,
// Run gives up on the store StoreCloseTimeout later and returns
// ErrStoreHung, logging at error level the flush it was stuck in; once the
// disk answers again the data directory opens and reconciles as after a
// crash.
func TestShutdown_HungFlushIsBounded(t *testing.T) {
	const (
		drainTimeout = 200 * time.Millisecond
		closeTimeout = 300 * time.Millisecond
	)
	var fs *faultstore.Store
	logs := &lockedBuffer{}
	dir := t.TempDir()
	h := start(t, server.Config{
		DataDir: dir, Logger: zerolog.New(logs),
		DrainTimeout: drainTimeout, StoreCloseTimeout: closeTimeout,
		WrapStore: func(st store.DurableStore) store.DurableStore {
			fs = faultstore.New(st)
			return fs
		},
	})
	t.Cleanup(func() { fs.Release() })
	a := h.dial()
	ca := a.enroll(1)

	fs.SetRules(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang))
	a.send(&wire.Tell{ID: a.id(), Conversation: ca.conv, Participant: ca.p, Generation: ca.gen, Token: token(), Payload: []byte("x")})
	select {
	case <-fs.Hung():
	case <-time.After(waitFor):
		t.Fatal("the tell's flush never started")
	}

	began := time.Now()
	h.stop()
	var err error
	select {
	case err = <-h.done:
	case <-time.After(waitFor):
		t.Fatalf("Run did not return within %v of the cancel with a hung flush", waitFor)
	}
	took := time.Since(began)
	h.once.Do(func() { h.err = err })
	if !errors.Is(err, server.ErrStoreHung) || !errors.Is(err, server.ErrDrainTimeout) {
		t.Fatalf("Run = %v, want ErrStoreHung and ErrDrainTimeout", err)
	}
	if took < drainTimeout+closeTimeout {
		t.Errorf("Run returned after %v, before drain-timeout + store-close-timeout = %v", took, drainTimeout+closeTimeout)
	}
	// The stuck tell is never answered told: its connection is closed.
	a.expectClosed()
	for len(a.in) > 0 {
		m := <-a.in
		if e, ok := m.(*wire.Error); !ok || (e.Code != wire.CodeInDoubt && e.Code != wire.CodeShuttingDown) {
			t.Errorf("the stuck tell was answered %#v, want no answer, in_doubt or shutting_down", m)
		}
	}

	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"message":"the store stopped answering`) {
			line = l
		}
	}
	for _, want := range []string{`"level":"error"`, `"store_call":"Flush"`, `"store_call_ms":`, `"waiting_for":[`} {
		if !strings.Contains(line, want) {
			t.Errorf("give-up log line %q lacks %s", line, want)
		}
	}

	// The disk answers again: the abandoned store finishes closing and
	// releases the directory, which a new server reconciles.
	fs.Release()
	h2 := start(t, server.Config{DataDir: dir})
	a2 := h2.dial()
	if a2.Welcome.Incarnation != 2 {
		t.Errorf("incarnation after the abandoned shutdown = %d, want 2", a2.Welcome.Incarnation)
	}
	a2.attach(ca)
}
