package server_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/wire"
)

func TestHandshake_Welcome(t *testing.T) {
	h := start(t, server.Config{MaxRecordBytes: 1000})
	a := h.dial()
	b := h.dial()
	w := a.Welcome
	if w.Version != 1 || w.Server != "participantd "+server.Version || w.Incarnation != 1 ||
		w.MaxFrame != wire.DefaultMaxFrame || w.MaxRecordBytes != 1000 {
		t.Errorf("welcome = %+v", w)
	}
	if b.Welcome.Connection <= w.Connection {
		t.Errorf("second connection ordinal %d, want > %d", b.Welcome.Connection, w.Connection)
	}
	if w.TokenWindow != nil || w.TokenSkew != nil {
		t.Errorf("welcome of a server without a token window announces token_window %v, token_skew %v; want both absent", w.TokenWindow, w.TokenSkew)
	}
}

// A server run with a token window announces it, and the skew, in
// milliseconds in its welcome; the skew defaults as the service's does.
func TestHandshake_WelcomeAnnouncesTokenWindow(t *testing.T) {
	for _, tc := range []struct {
		name         string
		cfg          server.Config
		window, skew uint64
	}{
		{"window and skew", server.Config{TokenWindow: time.Hour, TokenSkew: 30 * time.Second}, 3_600_000, 30_000},
		{"default skew", server.Config{TokenWindow: 10 * time.Minute}, 600_000, uint64(participant.DefaultTokenSkew.Milliseconds())},
		{"skew above the window", server.Config{TokenWindow: 10 * time.Second, TokenSkew: time.Minute}, 10_000, 60_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := start(t, tc.cfg).dial().Welcome
			if diff := cmp.Diff(&wire.Welcome{Version: 1, Server: "participantd " + server.Version, Incarnation: 1,
				Connection: w.Connection, MaxFrame: wire.DefaultMaxFrame, MaxRecordBytes: uint64(participant.DefaultMaxRecordBytes),
				TokenWindow: new(tc.window), TokenSkew: new(tc.skew)}, w); diff != "" {
				t.Errorf("welcome mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandshake_Refusals(t *testing.T) {
	h := start(t, server.Config{AuthToken: "s3cret"})
	auth := func(s string) *string { return &s }
	for _, tc := range []struct {
		name string
		send func(c *client)
		want wire.Reason
	}{
		{"request before hello", func(c *client) { c.send(&wire.Ping{ID: 1}) }, wire.ReasonHelloRequired},
		{"enroll before hello", func(c *client) { c.send(&wire.Enroll{ID: 1, Conversation: 1, Token: token()}) }, wire.ReasonHelloRequired},
		{"unknown type before hello", func(c *client) { c.sendMap(map[string]any{"t": "hullo", "id": 1}) }, wire.ReasonHelloRequired},
		{"garbage before hello", func(c *client) { c.sendFrame([]byte{0xc1, 0xc1}) }, wire.ReasonMalformed},
		{"no version 1", func(c *client) { c.send(&wire.Hello{Versions: []uint64{2, 3}, Auth: auth("s3cret")}) }, wire.ReasonUnsupportedVersion},
		{"no auth", func(c *client) { c.send(&wire.Hello{Versions: []uint64{1}}) }, wire.ReasonAuthFailed},
		{"wrong auth", func(c *client) { c.send(&wire.Hello{Versions: []uint64{1}, Auth: auth("s3cre")}) }, wire.ReasonAuthFailed},
		{"oversized header before hello", func(c *client) { c.sendBytes(header(wire.DefaultMaxFrame + 1)) }, wire.ReasonFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.dialRaw()
			c.t = t
			tc.send(c)
			c.expectRejected(tc.want)
		})
	}
	t.Run("right auth", func(t *testing.T) {
		c := h.dial()
		c.ping()
	})
}

func TestHandshake_SecondHelloIsMalformed(t *testing.T) {
	h := start(t, server.Config{})
	c := h.dial()
	c.ping()
	c.send(&wire.Hello{Versions: []uint64{1}})
	c.expectRejected(wire.ReasonMalformed)
}

func TestHandshake_HelloTimeout(t *testing.T) {
	h := start(t, server.Config{HelloTimeout: 50 * time.Millisecond})
	c := h.dialRaw()
	c.expectRejected(wire.ReasonHelloRequired)
}

func TestHandshake_Overloaded(t *testing.T) {
	h := start(t, server.Config{MaxConnections: 1})
	a := h.dial()
	b := h.dialRaw()
	b.expectRejected(wire.ReasonOverloaded)
	a.ping()
}

func TestHandshake_TLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile})
	nc, err := tls.Dial("tcp", h.srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("tls.Dial: %v", err)
	}
	c := newClient(t, nc)
	c.send(&wire.Hello{Versions: []uint64{1}})
	if m, ok := c.next().(*wire.Welcome); !ok {
		t.Fatalf("hello over TLS answered %#v", m)
	}
	c.enroll(1)
}

func TestNew_TLSNeedsBoth(t *testing.T) {
	_, err := server.New(server.Config{TLSCert: "x.pem", Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"})
	if err == nil {
		t.Fatal("New with tls-cert and no tls-key succeeded")
	}
}

// selfSigned is servertest.SelfSigned, which the client's and
// participantctl's TLS tests share.
var selfSigned = servertest.SelfSigned
