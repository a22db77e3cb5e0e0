package client_test

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// events records the connection-state callbacks of a client, in order.
type events struct {
	mu   sync.Mutex
	log  []string
	lost []error
	ch   chan struct{} // one send per callback, never blocking
}

func newEvents() *events { return &events{ch: make(chan struct{}, 100)} }

func (e *events) add(s string, lost error) {
	e.mu.Lock()
	e.log = append(e.log, s)
	if lost != nil {
		e.lost = append(e.lost, lost)
	}
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

func (e *events) options() client.Options {
	return client.Options{
		OnDisconnect: func(err error) { e.add("disconnect", nil) },
		OnReconnect:  func(w client.Welcome) { e.add("reconnect", nil) },
		OnCredential: func(c client.Credential) { e.add("credential g"+itoa(c.Generation), nil) },
		OnLost: func(c client.Credential, reason error) {
			e.add("lost p"+itoa(c.Participant)+" g"+itoa(c.Generation), reason)
		},
	}
}

// waitFor waits until the log ends with want.
func (e *events) waitFor(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		e.mu.Lock()
		got := append([]string(nil), e.log...)
		e.mu.Unlock()
		if len(got) >= len(want) && cmp.Equal(got[len(got)-len(want):], want) {
			return
		}
		select {
		case <-e.ch:
		case <-deadline:
			t.Fatalf("callbacks = %q, want them to end with %q", got, want)
		}
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func TestClient_Callbacks_DisconnectReattachReconnect(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	c := dialT(t, srv, ev.options())
	if _, err := c.Enroll(ctx, 5); err != nil {
		t.Fatal(err)
	}
	ev.waitFor(t, "credential g1")
	srv.dropAll()
	// The re-attachment's new credential comes before the reconnect is
	// announced: by then every participant is bound again.
	ev.waitFor(t, "disconnect", "credential g2", "reconnect")
}

// supersede attaches participant p of conv elsewhere, as another session
// would, and returns the credential that session got.
func supersede(srv *fakeServer, conv, p uint64) client.Credential {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.supersedeLocked(conv, p)
	m := srv.convs[conv].members[p]
	return client.Credential{Conversation: conv, Participant: p, Generation: m.gen, Secret: m.secrets[m.gen]}
}

func TestClient_OnLost_BindingCheckNoticesSupersession(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	opts := ev.options()
	opts.BindingCheckInterval = 5 * time.Millisecond
	c := dialT(t, srv, opts)
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	newer := supersede(srv, 5, cred.Participant)
	// Nothing is sent by the caller: the check notices.
	ev.waitFor(t, "lost p0 g1")
	ev.mu.Lock()
	reason := ev.lost[0]
	ev.mu.Unlock()
	if !errors.Is(reason, client.ErrParticipantLost) || !errors.Is(reason, client.ErrBindingSuperseded) ||
		!errors.Is(reason, client.ErrStaleAuthority) {
		t.Errorf("OnLost reason = %v, want participant lost, binding superseded, stale_authority", reason)
	}
	if _, err := c.Tell(ctx, cred, []byte("x")); !errors.Is(err, client.ErrParticipantLost) {
		t.Errorf("Tell after the loss = %v, want ErrParticipantLost", err)
	}
	// The credential the other session saved takes the participant back.
	got, err := c.Attach(ctx, newer)
	if err != nil || got.Generation != newer.Generation+1 {
		t.Fatalf("Attach(newer) = %v, %v; want generation %d", got, err, newer.Generation+1)
	}
	if _, err := c.Tell(ctx, cred, []byte("y")); err != nil {
		t.Errorf("Tell after taking it back = %v", err)
	}
}

func TestClient_OnLost_RefusedTellNoticesSupersession(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	opts := ev.options()
	opts.BindingCheckInterval = -1
	c := dialT(t, srv, opts)
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	supersede(srv, 5, cred.Participant)
	_, err = c.Tell(ctx, cred, []byte("x"))
	var le *client.LostError
	if !errors.As(err, &le) || !errors.Is(err, client.ErrBindingSuperseded) || le.Participant != cred.Participant {
		t.Fatalf("Tell = %v, want a *LostError of a superseded binding", err)
	}
	ev.waitFor(t, "lost p0 g1")
	// A reconnect does not re-attach a lost participant: the other session
	// keeps its binding.
	srv.dropAll()
	ev.waitFor(t, "disconnect", "reconnect")
	for _, a := range attaches(srv) {
		t.Errorf("the client attached %+v after losing the participant", a)
	}
	ev.mu.Lock()
	if n := len(ev.lost); n != 1 {
		t.Errorf("OnLost called %d times, want 1", n)
	}
	ev.mu.Unlock()
}

func TestClient_OnLost_Retired(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	opts := ev.options()
	opts.BindingCheckInterval = 5 * time.Millisecond
	c := dialT(t, srv, opts)
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	m := srv.convs[5].members[cred.Participant]
	m.retired, m.bound = true, nil
	srv.mu.Unlock()
	ev.waitFor(t, "lost p0 g1")
	ev.mu.Lock()
	reason := ev.lost[0]
	ev.mu.Unlock()
	if !errors.Is(reason, client.ErrRetired) || errors.Is(reason, client.ErrBindingSuperseded) {
		t.Errorf("OnLost reason = %v, want retired", reason)
	}
}

func TestClient_BindingCheck_ChangesNothing(t *testing.T) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	ev := newEvents()
	opts := ev.options()
	opts.BindingCheckInterval = time.Millisecond
	c := dialT(t, srv, opts)
	cred, err := c.Enroll(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for a few checks: they are acks at the cursor, answered noop.
	deadline := time.After(10 * time.Second)
	for n := 0; n < 3; {
		n = 0
		for _, m := range srv.seen() {
			if a, ok := m.(*wire.Ack); ok && a.Through == 0 {
				n++
			}
		}
		select {
		case <-deadline:
			t.Fatalf("%d binding checks seen, want 3", n)
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := c.Tell(ctx, cred, []byte("x")); err != nil {
		t.Errorf("Tell = %v", err)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.lost) != 0 {
		t.Errorf("OnLost called for a participant still bound: %v", ev.lost)
	}
}
