package client_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

// A connection the server closes for idleness (bye{idle}) ends normally:
// the client reports no disconnect and reconnects when a call needs it.
func TestClient_ByeIdle_QuietEnd(t *testing.T) {
	srv := newFakeServer(t)
	var (
		mu           sync.Mutex
		disconnected []error
		reconnected  int
	)
	c := dialT(t, srv, client.Options{
		OnDisconnect: func(err error) { mu.Lock(); disconnected = append(disconnected, err); mu.Unlock() },
		OnReconnect:  func(client.Welcome) { mu.Lock(); reconnected++; mu.Unlock() },
	})
	ctx := testCtx(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}

	srv.sayByeWith(wire.ByeIdle)
	// A ping sent before the client read the bye is lost with the
	// connection (Ping is not retried); the next one needs a new one.
	for {
		err := c.Ping(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, client.ErrConnectionLost) {
			t.Fatalf("Ping after bye{idle} = %v, want nil or ErrConnectionLost", err)
		}
	}
	if got := srv.dials(); got != 2 {
		t.Errorf("the server accepted %d connections, want 2", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(disconnected) != 0 || reconnected != 0 {
		t.Errorf("after bye{idle}: OnDisconnect %v, OnReconnect %d times; want neither", disconnected, reconnected)
	}
}
