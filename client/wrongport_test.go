package client_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// TestDial_HealthListener_SaysWhatItLikelyIs: a client dialled to the
// health (HTTP) listener, whose HTTP server waits for a request line the
// hello never completes, gets no welcome before its deadline; the error
// says so and names the likely mistake, not only "i/o timeout", and
// still unwraps to the deadline. Through a Cluster too (participantctl's
// way, bounded by its AttemptTimeout).
func TestDial_HealthListener_SaysWhatItLikelyIs(t *testing.T) {
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	health := srv.HealthAddr().String()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s of the health listener succeeded", what)
		}
		msg := err.Error()
		for _, want := range []string{"no welcome", health, "protocol listener", "health listener"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s of the health listener = %q, want it to say %q", what, msg, want)
			}
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s of the health listener = %v, want it to unwrap to os.ErrDeadlineExceeded", what, err)
		}
	}
	_, err := client.Dial(context.Background(), health, client.Options{DialTimeout: 300 * time.Millisecond})
	check("Dial", err)
	_, err = client.DialCluster(context.Background(), []string{health},
		client.ClusterOptions{AttemptTimeout: 300 * time.Millisecond})
	check("DialCluster", err)
}

// TestDial_Canceled_NoWrongPortHint: a dial its caller cancels during
// the handshake is not blamed on the address.
func TestDial_Canceled_NoWrongPortHint(t *testing.T) {
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := client.Dial(ctx, srv.HealthAddr().String(), client.Options{DialTimeout: time.Minute})
		done <- err
	}()
	cancel()
	err := <-done
	if err == nil || strings.Contains(err.Error(), "no welcome") {
		t.Errorf("a canceled Dial = %v, want an error without the wrong-port hint", err)
	}
}
