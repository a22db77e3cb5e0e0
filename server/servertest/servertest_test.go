package servertest_test

import (
	"net"
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// Start returns a ready server on loopback; Stop ends Run cleanly and is
// idempotent.
func TestStart_ServesUntilStop(t *testing.T) {
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatalf("dial the started server: %v", err)
	}
	c.Close()
	if err := srv.Stop(); err != nil {
		t.Fatalf("Stop() = %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("second Stop() = %v", err)
	}
	if _, err := net.Dial("tcp", srv.Addr().String()); err == nil {
		t.Error("the server still accepts after Stop")
	}
}

// TryStart hands a start that cannot happen back to the caller.
func TestTryStart_AddressInUse_ReturnsTheError(t *testing.T) {
	first := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	srv, err := servertest.TryStart(t, server.Config{DataDir: t.TempDir(), Listen: first.Addr().String()})
	if err == nil {
		t.Fatalf("TryStart on a bound address = %v, nil; want an error", srv.Addr())
	}
}
