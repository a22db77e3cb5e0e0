package server_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
	"github.com/participantd/participantd/wire/wsframe"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor bounds every wait of these tests.
const waitFor = 10 * time.Second

// harness is a server running in process on a temporary data directory.
type harness struct {
	t    *testing.T
	srv  *server.Server
	cfg  server.Config
	stop context.CancelFunc
	done chan error
	once sync.Once
	err  error
	// ws makes dialRaw connect over the WebSocket listener (as -ws does
	// for every test).
	ws bool
}

// start runs a server with cfg on 127.0.0.1 port 0; DataDir defaults to a
// new temporary directory. It is stopped (drained) at the end of the test.
func start(t *testing.T, cfg server.Config) *harness {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.Listen = "127.0.0.1:0"
	cfg.HealthListen = "127.0.0.1:0"
	cfg.WSListen = "127.0.0.1:0"
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, srv: srv, cfg: cfg, stop: cancel, done: make(chan error, 1)}
	go func() { h.done <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-h.done:
		t.Fatalf("Run = %v before ready", err)
	case <-time.After(waitFor):
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { h.shutdown() })
	return h
}

// shutdown drains the server and returns Run's error.
func (h *harness) shutdown() error {
	h.once.Do(func() {
		h.stop()
		select {
		case h.err = <-h.done:
		case <-time.After(waitFor):
			h.t.Fatal("Run did not return after the drain")
		}
	})
	return h.err
}

func (h *harness) get(path string) (int, string) {
	h.t.Helper()
	resp, err := http.Get("http://" + h.srv.HealthAddr().String() + path)
	if err != nil {
		h.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// client is a raw protocol client: frames through package wire, one
// reader goroutine, answers matched by id and deliveries collected apart.
type client struct {
	t  *testing.T
	nc net.Conn
	// +checklocks:wm
	w  *wire.Writer
	wm sync.Mutex

	in     chan wire.Message // everything but deliveries
	dl     chan *wire.Delivery
	closed chan struct{} // closed when the reader stops
	rerr   error         // why, valid after closed

	nextID  uint64
	Welcome *wire.Welcome
	// raw is, over a WebSocket, the TCP connection under it; nil over TCP.
	raw net.Conn
}

// overWS reports whether the harness's clients dial the WebSocket
// listener (-ws, or a WebSocket test).
func (h *harness) overWS() bool { return *overWS || h.ws }

// transport is the transport label of the connections the harness's
// clients open.
func (h *harness) transport() string {
	if h.overWS() {
		return "ws"
	}
	return "tcp"
}

// openConnections returns how many connections of the harness's transport
// the server serves.
func (h *harness) openConnections() float64 {
	h.t.Helper()
	return h.metric(server.MetricConnectionsOpen + `{transport="` + h.transport() + `"}`)
}

// dialRaw connects without a hello.
func (h *harness) dialRaw() *client {
	h.t.Helper()
	if h.overWS() {
		ws, raw := h.dialWSTCP(nil, 0)
		c := newClient(h.t, wsframe.New(ws))
		c.raw = raw
		return c
	}
	nc, err := net.Dial("tcp", h.srv.Addr().String())
	if err != nil {
		h.t.Fatalf("dial: %v", err)
	}
	return newClient(h.t, nc)
}

func newClient(t *testing.T, nc net.Conn) *client {
	c := &client{
		t: t, nc: nc, w: wire.NewWriter(nc, min(1<<31, math.MaxInt)),
		in: make(chan wire.Message, 4096), dl: make(chan *wire.Delivery, 1<<16),
		closed: make(chan struct{}), nextID: 100,
	}
	t.Cleanup(func() {
		nc.Close()
		<-c.closed
	})
	go c.read()
	return c
}

func (c *client) read() {
	defer close(c.closed)
	r := wire.NewReader(bufio.NewReader(c.nc), 16<<20)
	for {
		body, err := r.ReadFrame()
		if err != nil {
			c.rerr = err
			return
		}
		m, err := wire.DecodeServerMessage(body)
		if err != nil {
			c.rerr = err
			return
		}
		if d, ok := m.(*wire.Delivery); ok {
			c.dl <- d
			continue
		}
		c.in <- m
	}
}

// dial connects and completes the handshake.
func (h *harness) dial() *client {
	h.t.Helper()
	c := h.dialRaw()
	c.send(&wire.Hello{Versions: []uint64{1}, Auth: authOf(h.cfg.AuthToken)})
	w, ok := c.next().(*wire.Welcome)
	if !ok {
		h.t.Fatalf("hello answered %#v, want welcome", w)
	}
	c.Welcome = w
	return c
}

func authOf(tok string) *string {
	if tok == "" {
		return nil
	}
	return &tok
}

func (c *client) send(m wire.Message) {
	c.t.Helper()
	c.sendFrame(wire.Encode(m))
}

func (c *client) sendFrame(body []byte) {
	c.t.Helper()
	c.wm.Lock()
	defer c.wm.Unlock()
	if err := c.w.WriteFrame(body); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// sendFrameStart sends the start of a frame, prefix (its header and the
// first bytes of its body), and never the rest: over TCP the bytes, over a
// WebSocket a message whose header announces the whole frame.
func (c *client) sendFrameStart(prefix []byte) {
	c.t.Helper()
	if c.raw == nil {
		c.sendBytes(prefix)
		return
	}
	size := wire.HeaderLen + int(binary.BigEndian.Uint32(prefix))
	c.wm.Lock()
	defer c.wm.Unlock()
	if _, err := c.raw.Write(wsMessageStart(size, prefix)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// closeWrite ends what the client sends and goes on reading: a TCP
// half-close; over a WebSocket, which has none of its own, the half-close
// of the TCP connection under it.
func (c *client) closeWrite() {
	c.t.Helper()
	nc := c.nc
	if c.raw != nil {
		nc = c.raw
	}
	if err := nc.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		c.t.Fatalf("close write: %v", err)
	}
}

func (c *client) sendBytes(b []byte) {
	c.t.Helper()
	c.wm.Lock()
	defer c.wm.Unlock()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
	// Over a WebSocket, what is left of a partial frame goes as one
	// message, as a TCP write sends it.
	if ws, ok := c.nc.(*wsframe.Conn); ok {
		if err := ws.FlushPartial(); err != nil {
			c.t.Fatalf("write: %v", err)
		}
	}
}

// sendMap sends a hand-made body.
func (c *client) sendMap(m map[string]any) {
	c.t.Helper()
	b, err := msgpack.Marshal(m)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendFrame(b)
}

// next returns the next non-delivery message.
func (c *client) next() wire.Message {
	c.t.Helper()
	select {
	case m := <-c.in:
		return m
	case <-c.closed:
		select {
		case m := <-c.in:
			return m
		default:
		}
		c.t.Fatalf("connection ended (%v) while waiting for a message", c.rerr)
	case <-time.After(waitFor):
		c.t.Fatal("no message")
	}
	return nil
}

// expectClosed waits until the server closed the connection.
func (c *client) expectClosed() {
	c.t.Helper()
	select {
	case <-c.closed:
		if !errors.Is(c.rerr, io.EOF) && !errors.Is(c.rerr, io.ErrUnexpectedEOF) && !isReset(c.rerr) {
			c.t.Fatalf("connection ended with %v, want EOF", c.rerr)
		}
	case <-time.After(waitFor):
		c.t.Fatal("connection not closed")
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// expectRejected reads the next message, wants rejected{reason}, then the
// close.
func (c *client) expectRejected(reason wire.Reason) {
	c.t.Helper()
	m := c.next()
	r, ok := m.(*wire.Rejected)
	if !ok || r.Reason != reason {
		c.t.Fatalf("got %#v, want rejected %s", m, reason)
	}
	c.expectClosed()
}

func (c *client) id() uint64 {
	c.nextID++
	return c.nextID
}

// call sends a request and returns its answer; requests must carry the id
// from c.id(). Answers to other ids fail the test.
func (c *client) call(m wire.Message) wire.Message {
	c.t.Helper()
	id, _ := wire.ID(m)
	c.send(m)
	a := c.next()
	if got, _ := wire.ID(a); got != id {
		c.t.Fatalf("answer %#v to id %d, want id %d", a, got, id)
	}
	return a
}

// delivery returns the next delivery.
func (c *client) delivery() *wire.Delivery {
	c.t.Helper()
	select {
	case d := <-c.dl:
		return d
	case <-time.After(waitFor):
		c.t.Fatal("no delivery")
	}
	return nil
}

// deliveryWhere skips deliveries until one satisfies ok.
func (c *client) deliveryWhere(ok func(*wire.Delivery) bool) *wire.Delivery {
	c.t.Helper()
	for {
		if d := c.delivery(); ok(d) {
			return d
		}
	}
}

func token() wire.Token {
	var t wire.Token
	rand.Read(t[:])
	return t
}

// cred is a participant's credential as a test keeps it.
type cred struct {
	conv, p, gen uint64
	secret       wire.Secret
}

func (c *client) enroll(conv uint64) cred {
	c.t.Helper()
	a := c.call(&wire.Enroll{ID: c.id(), Conversation: conv, Token: token()})
	e, ok := a.(*wire.Enrolled)
	if !ok {
		c.t.Fatalf("enroll answered %#v", a)
	}
	return cred{conv, e.Participant, e.Generation, e.Secret}
}

func (c *client) attach(cr cred) cred {
	c.t.Helper()
	a := c.call(&wire.Attach{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Secret: cr.secret, Token: token()})
	e, ok := a.(*wire.Attached)
	if !ok {
		c.t.Fatalf("attach answered %#v", a)
	}
	return cred{cr.conv, e.Participant, e.Generation, e.Secret}
}

func (c *client) tell(cr cred, payload string) *wire.Told {
	c.t.Helper()
	a := c.call(&wire.Tell{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte(payload)})
	told, ok := a.(*wire.Told)
	if !ok {
		c.t.Fatalf("tell answered %#v", a)
	}
	return told
}

func (c *client) ping() {
	c.t.Helper()
	if a, ok := c.call(&wire.Ping{ID: c.id()}).(*wire.Pong); !ok {
		c.t.Fatalf("ping answered %#v", a)
	}
}

func header(n uint32) []byte {
	return binary.BigEndian.AppendUint32(nil, n)
}
