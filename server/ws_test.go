package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/participantd/participantd/wire/wsframe"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// overWS runs every wire test over the WebSocket listener: go test
// ./server -args -ws (make test runs it with -short).
var overWS = flag.Bool("ws", false, "dial the wire tests over the WebSocket listener")

// dialWS opens a WebSocket to the server with the request headers hdr and
// returns it as a stream of frames, each whole frame written sent as one
// binary message (PROTOCOL.md, WebSocket).
func (h *harness) dialWS(hdr http.Header) net.Conn {
	h.t.Helper()
	return wsframe.New(h.dialWSConn(hdr))
}

func (h *harness) dialWSConn(hdr http.Header) *websocket.Conn {
	h.t.Helper()
	ws, _ := h.dialWSTCP(hdr, 0)
	return ws
}

// dialWSTCP is dialWSConn that also returns the TCP connection under the
// WebSocket, its receive buffer set to rcvbuf bytes (0: the kernel's), so
// that a test can hold the kernel's share of a reader that does not read
// as small as over TCP, or write what no library would send.
func (h *harness) dialWSTCP(hdr http.Header, rcvbuf int) (*websocket.Conn, net.Conn) {
	h.t.Helper()
	var raw net.Conn
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := nc.(*net.TCPConn); ok && rcvbuf > 0 {
			tc.SetReadBuffer(rcvbuf)
		}
		raw = nc
		return nc, nil
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: dial}}
	ws, _, err := websocket.Dial(context.Background(), "ws://"+h.srv.WSAddr().String()+"/", &websocket.DialOptions{HTTPHeader: hdr, HTTPClient: hc})
	if err != nil {
		h.t.Fatalf("websocket dial: %v", err)
	}
	ws.SetReadLimit(-1)
	return ws, raw
}

// wsMessageStart returns the start of a masked binary WebSocket message
// (RFC 6455, 5.2) whose header announces size payload bytes, of which
// only prefix follows: a message still arriving, as a frame of the
// protocol is over TCP while its body is on its way.
func wsMessageStart(size int, prefix []byte) []byte {
	b := []byte{0x82} // FIN, binary
	switch {
	case size < 126:
		b = append(b, 0x80|byte(size))
	case size <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, 0x80|126), uint16(size))
	default:
		b = binary.BigEndian.AppendUint64(append(b, 0x80|127), uint64(size))
	}
	key := [4]byte{0x1f, 0x2e, 0x3d, 0x4c}
	b = append(b, key[:]...)
	for i, x := range prefix {
		b = append(b, x^key[i%4])
	}
	return b
}

func startWS(t *testing.T, cfg server.Config) *harness {
	h := start(t, cfg)
	h.ws = true
	return h
}

// The wire exchange of a client over WebSocket: hello, welcome, enroll,
// tell, delivery, as over TCP.
func TestWS_Exchange(t *testing.T) {
	h := startWS(t, server.Config{AuthToken: "tok"})
	a, b := h.dial(), h.dial()
	cr := a.enroll(1)
	b.attach(b.enroll(1))
	a.tell(cr, "over websocket")
	if d := b.delivery(); string(d.Payload) != "over websocket" {
		t.Fatalf("delivery %q", d.Payload)
	}
}

// A wrong auth token over WebSocket is rejected as over TCP.
func TestWS_AuthFailed(t *testing.T) {
	h := startWS(t, server.Config{AuthToken: "tok"})
	c := h.dialRaw()
	bad := "nope"
	c.send(&wire.Hello{Versions: []uint64{1}, Auth: &bad})
	c.expectRejected(wire.ReasonAuthFailed)
}

// A frame header announcing more than max_frame is refused from the header
// alone.
func TestWS_OversizedFrame(t *testing.T) {
	h := startWS(t, server.Config{})
	ws := h.dialWSConn(nil)
	ctx := context.Background()
	ws.Write(ctx, websocket.MessageBinary, hello(t))
	ws.Write(ctx, websocket.MessageBinary, append(header(uint32(wire.DefaultMaxFrame+1)), 0x80))
	_, msgs := closeStatus(t, ws)
	m, err := wire.DecodeServerMessage(msgs[len(msgs)-1][4:])
	if r, ok := m.(*wire.Rejected); err != nil || !ok || r.Reason != wire.ReasonFrameTooLarge {
		t.Fatalf("last message %#v (%v), want rejected frame_too_large", m, err)
	}
}

// closeStatus reads from ws until it ends and returns the close code.
func closeStatus(t *testing.T, ws *websocket.Conn) (websocket.StatusCode, [][]byte) {
	var msgs [][]byte
	for {
		_, b, err := ws.Read(context.Background())
		if err != nil {
			return websocket.CloseStatus(err), msgs
		}
		msgs = append(msgs, b)
	}
}

func hello(t *testing.T) []byte {
	return wire.AppendFrame(nil, &wire.Hello{Versions: []uint64{1}})
}

// A text message is a protocol error: the server closes with 1003.
func TestWS_TextMessageRefused(t *testing.T) {
	h := startWS(t, server.Config{})
	ws := h.dialWSConn(nil)
	if err := ws.Write(context.Background(), websocket.MessageText, hello(t)); err != nil {
		t.Fatal(err)
	}
	if code, _ := closeStatus(t, ws); code != websocket.StatusUnsupportedData {
		t.Fatalf("close code %v, want %v", code, websocket.StatusUnsupportedData)
	}
}

// A message holding a frame and more, or half a frame, is refused.
func TestWS_MessageNotOneFrame(t *testing.T) {
	h := startWS(t, server.Config{})
	for i, msg := range [][]byte{append(hello(t), 0), hello(t)[:6]} {
		t.Logf("case %d", i)
		ws := h.dialWSConn(nil)
		if err := ws.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
			t.Fatal(err)
		}
		if code, _ := closeStatus(t, ws); code != websocket.StatusPolicyViolation {
			t.Fatalf("close code %v, want %v", code, websocket.StatusPolicyViolation)
		}
	}
}

// A page of another site is refused at the upgrade; a client with no
// Origin, or of the listener's own host, is served.
func TestWS_CrossOriginRefused(t *testing.T) {
	h := startWS(t, server.Config{WSAllowedOrigins: []string{"app.example.com"}})
	_, resp, err := websocket.Dial(context.Background(), "ws://"+h.srv.WSAddr().String()+"/",
		&websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://evil.example.org"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin dial: %v, %v; want 403", err, resp)
	}
	for _, o := range []string{"https://app.example.com", "http://" + h.srv.WSAddr().String()} {
		c := newClient(t, h.dialWS(http.Header{"Origin": {o}}))
		c.send(&wire.Hello{Versions: []uint64{1}})
		if _, ok := c.next().(*wire.Welcome); !ok {
			t.Fatalf("origin %s not welcomed", o)
		}
	}
}

// A drain sends bye, then a close frame with 1001 (going away).
func TestWS_DrainByeThenClose(t *testing.T) {
	h := startWS(t, server.Config{})
	ws := h.dialWSConn(nil)
	if err := ws.Write(context.Background(), websocket.MessageBinary, hello(t)); err != nil {
		t.Fatal(err)
	}
	if _, b, err := ws.Read(context.Background()); err != nil {
		t.Fatal(err)
	} else if m, err := wire.DecodeServerMessage(b[4:]); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*wire.Welcome); !ok {
		t.Fatalf("got %#v, want welcome", m)
	}
	done := make(chan error, 1)
	go func() { done <- h.shutdown() }()
	code, msgs := closeStatus(t, ws)
	if code != websocket.StatusGoingAway {
		t.Fatalf("close code %v, want going away", code)
	}
	if len(msgs) == 0 {
		t.Fatal("no bye before the close")
	}
	m, err := wire.DecodeServerMessage(msgs[len(msgs)-1][4:])
	if bye, ok := m.(*wire.ServerBye); err != nil || !ok || bye.Reason != wire.ByeShutdown {
		t.Fatalf("last message %#v (%v), want bye shutdown", m, err)
	}
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("shutdown: %v", err)
	}
}

// A peer that opens a TCP connection to the WebSocket listener and sends
// half an upgrade request is closed at HelloTimeout: the upgrade runs
// under the hello's deadline.
func TestWS_SlowUpgradeIsClosed(t *testing.T) {
	h := startWS(t, server.Config{HelloTimeout: 200 * time.Millisecond})
	nc, err := net.Dial("tcp", h.srv.WSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n")
	nc.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.Copy(io.Discard, nc); err != nil {
		t.Fatalf("the connection was not closed: %v", err)
	}
}

// A WebSocket peer that stops reading while deliveries pile up is cut at
// WriteProgressTimeout, as over TCP, and the server stays well.
func TestWS_PeerThatStopsReadingIsCut(t *testing.T) {
	h := startWS(t, server.Config{WriteProgressTimeout: 300 * time.Millisecond})
	ws := h.dialWSConn(nil)
	ctx := context.Background()
	ws.Write(ctx, websocket.MessageBinary, hello(t))
	enroll := wire.AppendFrame(nil, &wire.Enroll{ID: 1, Conversation: 1, Token: token()})
	ws.Write(ctx, websocket.MessageBinary, enroll)
	sender := h.dial()
	cr := sender.enroll(1)
	big := string(make([]byte, 64<<10))
	deadline := time.Now().Add(waitFor)
	for h.metric(server.MetricConnectionsOpen+`{transport="ws"}`) == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the deaf WebSocket peer was not cut")
		}
		sender.tell(cr, big)
	}
	sender.ping()
}

// wss: the WebSocket listener serves TLS with the wire listener's
// certificate.
func TestWS_TLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	ws, _, err := websocket.Dial(context.Background(), "wss://"+h.srv.WSAddr().String()+"/", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("wss dial: %v", err)
	}
	c := newClient(t, wsframe.New(ws))
	c.send(&wire.Hello{Versions: []uint64{1}})
	if m, ok := c.next().(*wire.Welcome); !ok {
		t.Fatalf("hello over wss answered %#v", m)
	}
	c.ping()
}

// Issue 27, finding 2: a page under another name rebound to the listener's
// address (DNS rebinding) sends Host and Origin of that name, which agree:
// the upgrade is refused unless the name is an IP literal, localhost or
// one of --ws-allowed-origins. A client sending no Origin (not a browser)
// and one naming the listener by its address are served.
func TestWS_ReboundHostRefused(t *testing.T) {
	h := startWS(t, server.Config{WSAllowedOrigins: []string{"app.example.com"}})
	_, port, _ := net.SplitHostPort(h.srv.WSAddr().String())
	for _, name := range []string{"evil.example", "evil.localhost.example"} {
		req := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %[1]s:%[2]s\r\nOrigin: http://%[1]s:%[2]s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", name, port)
		nc, err := net.Dial("tcp", h.srv.WSAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(waitFor))
		if _, err := io.WriteString(nc, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		nc.Close()
		if err != nil {
			t.Fatalf("Host %s: %v", name, err)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			t.Errorf("Host and Origin %s: 101, want the upgrade refused", name)
		}
	}
	for _, hdr := range []http.Header{nil, {"Origin": {"http://" + h.srv.WSAddr().String()}}, {"Origin": {"https://app.example.com"}}} {
		c := newClient(t, h.dialWS(hdr))
		c.send(&wire.Hello{Versions: []uint64{1}})
		if _, ok := c.next().(*wire.Welcome); !ok {
			t.Fatalf("headers %v not welcomed", hdr)
		}
	}
}

// Issue 26: a text message is the peer breaking the protocol, so the
// binding it held dies with protocol_error, as for a malformed frame over
// TCP, not connection_lost.
func TestWS_TextMessageEndsBindingAsProtocolError(t *testing.T) {
	h := startWS(t, server.Config{})
	by := h.dial()
	by.enroll(5)
	ws := h.dialWSConn(nil)
	c := newClient(t, wsframe.New(ws))
	c.send(&wire.Hello{Versions: []uint64{1}})
	if _, ok := c.next().(*wire.Welcome); !ok {
		t.Fatal("no welcome")
	}
	cr := c.enroll(5)
	by.deliveryWhere(func(d *wire.Delivery) bool { return d.Kind == wire.KindJoined && d.Participant == cr.p })
	if err := ws.Write(context.Background(), websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	d := by.deliveryWhere(func(d *wire.Delivery) bool { return d.Participant == cr.p })
	if d.Kind != wire.KindDied || d.Cause == nil || *d.Cause != wire.CauseProtocolError {
		t.Fatalf("bystander got %+v, want died/protocol_error", d)
	}
}
