package server

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// A drain, the idle timer, a lost lease and a cut end a connection by setting its
// read deadline to now; the reader, which sets and lifts a deadline of its
// own around each frame's body, must keep theirs. Otherwise a request that
// lands while a body is being read is lost, and a client that then only
// reads never gets its bye.
func TestConn_BodyDeadlineKeepsAnEndRequested(t *testing.T) {
	for _, tc := range []struct {
		name string
		flag func(*conn)
	}{
		{"drain", func(c *conn) { c.shutdown.Store(true) }},
		{"idle", func(c *conn) { c.idle.Store(true) }},
		{"lease lost", func(c *conn) { c.leaseLost.Store(true) }},
		{"cut by the pending budget", func(c *conn) { c.overBudget.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, peer := net.Pipe()
			defer nc.Close()
			defer peer.Close()
			c := &conn{nc: nc, pendingShare: newSharedBudget(1<<20, 10, 1024).join("")}
			// What requestShutdown, checkIdle and requestLeaseLost do,
			// while the reader is inside a body...
			tc.flag(c)
			c.nc.SetReadDeadline(time.Now())
			// ...after which the body arrives and its deadline is lifted.
			c.arrived()
			// A byte waits to be read, so that a lost deadline shows as a
			// read that succeeds rather than one that hangs (net.Pipe checks
			// the deadline first).
			go peer.Write([]byte{0})
			if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read after the body's deadline was lifted = %v, want the requested end's deadline (os.ErrDeadlineExceeded)", err)
			}
		})
	}
}
