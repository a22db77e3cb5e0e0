package server_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// silentConns opens n TCP connections to addr that never send a byte: over
// TLS, connections stuck before their ClientHello.
func silentConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	out := make([]net.Conn, n)
	for i := range out {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		t.Cleanup(func() { nc.Close() })
		out[i] = nc
	}
	return out
}

// closedWithin reports how many of conns the server closed within d: a
// read that ends in EOF or a reset rather than the test's own deadline.
func closedWithin(conns []net.Conn, d time.Duration) int {
	deadline := time.Now().Add(d)
	done := make(chan bool, len(conns))
	for _, nc := range conns {
		go func() {
			nc.SetReadDeadline(deadline)
			var b [512]byte
			for {
				if _, err := nc.Read(b[:]); err != nil {
					ne, ok := err.(net.Error)
					done <- !(ok && ne.Timeout())
					return
				}
			}
		}()
	}
	n := 0
	for range conns {
		if <-done {
			n++
		}
	}
	return n
}

// TestTLS_RefusedSilentConnectionsAreClosed is the probe of issue 18 item 3:
// a TLS server at its connection limit must still close the connections it
// refuses when their peer never sends a ClientHello. The refusal is written
// through TLS, so it runs the handshake, and every step of it has a
// deadline.
func TestTLS_RefusedSilentConnectionsAreClosed(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, MaxConnections: 1, HelloTimeout: 200 * time.Millisecond})
	holder := dialTLS(t, h, pool)
	const n = 20
	silent := silentConns(t, h.srv.Addr().String(), n)
	if got := closedWithin(silent, 5*time.Second); got != n {
		t.Errorf("the server closed %d of %d refused silent TLS connections within 5 s, want all", got, n)
	}
	holder.ping()
}

// TestTLS_DrainWithConnectionsStuckInTheHandshake: connections stuck in the
// TLS handshake, refused or admitted, do not hold the drain up.
func TestTLS_DrainWithConnectionsStuckInTheHandshake(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, MaxConnections: 2,
		HelloTimeout: time.Minute, DrainTimeout: 3 * time.Second, StoreCloseTimeout: time.Second})
	holder := dialTLS(t, h, pool)
	silentConns(t, h.srv.Addr().String(), 20)
	holder.ping()
	start := time.Now()
	if err := h.shutdown(); err != nil {
		t.Fatalf("Run after a drain with 20 connections stuck in the TLS handshake = %v (after %v), want nil", err, time.Since(start).Round(time.Millisecond))
	}
}

// dialTLS completes a TLS handshake and hello with the harness's server.
func dialTLS(t *testing.T, h *harness, pool *x509.CertPool) *client {
	t.Helper()
	nc, err := tls.Dial("tcp", h.srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("tls.Dial: %v", err)
	}
	c := newClient(t, nc)
	c.send(&wire.Hello{Versions: []uint64{1}, Auth: authOf(h.cfg.AuthToken)})
	if m, ok := c.next().(*wire.Welcome); !ok {
		t.Fatalf("hello over TLS answered %#v", m)
	}
	return c
}

// Every TLS connection of a listener is served with the same
// configuration, so that a client resumes its session on its next
// connection instead of running a whole handshake again.
func TestTLS_NextConnectionResumesTheSession(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile})
	conf := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", ClientSessionCache: tls.NewLRUClientSessionCache(1)}
	for i := range 2 {
		nc, err := tls.Dial("tcp", h.srv.Addr().String(), conf)
		if err != nil {
			t.Fatalf("tls.Dial %d: %v", i, err)
		}
		if resumed := nc.ConnectionState().DidResume; resumed != (i > 0) {
			t.Errorf("connection %d resumed a session: %v, want %v", i, resumed, i > 0)
		}
		// Reading welcome takes in the session ticket that TLS 1.3 sends
		// after the handshake.
		c := newClient(t, nc)
		c.send(&wire.Hello{Versions: []uint64{1}})
		if m, ok := c.next().(*wire.Welcome); !ok {
			t.Fatalf("hello over TLS answered %#v", m)
		}
	}
}

// A peer that does not speak TLS to a TLS listener, the wire one or the
// WebSocket one, is closed without a word and counted as a failed TLS
// handshake, not as a refused hello.
func TestTLS_FailedHandshakeCountedOnEveryListener(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t, t.TempDir())
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile})
	addrs := []string{h.srv.Addr().String(), h.srv.WSAddr().String()}
	for _, addr := range addrs {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if got := closedWithin([]net.Conn{nc}, waitFor); got != 1 {
			t.Fatalf("the server did not close a connection to %s that does not speak TLS", addr)
		}
	}
	eventually(t, "every failed handshake counted", func() bool {
		return h.metric(server.MetricRefusedTotal+`{reason="tls_handshake"}`) == float64(len(addrs))
	})
}
