package server

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// conn serves one accepted connection; see the package documentation for
// its goroutines and teardown.
type conn struct {
	srv *Server
	nc  net.Conn
	// br buffers the socket; hrd reads hello from it, rd every frame
	// after. Before hello br is small (helloBuffer), so that a socket
	// nobody has authenticated costs little; welcome replaces it with
	// one of readBuffer.
	br    *bufio.Reader
	hrd   *wire.Reader
	rd    *wire.Reader
	start time.Time
	log   zerolog.Logger
	// peer is the key of the connection's address in Server.peers, which
	// counts it when limited.
	peer    netip.Prefix
	limited bool
	// count is what Server.peers counts of it (limits.go), guarded by
	// Server.mu.
	count connCount // +checklocksignore: guarded by Server.mu, out of reach of the annotations
	// creates is the connection's conversation bucket: its address's, or
	// its own when its address is exempt from the peer limits.
	creates *creations

	// shutdown is set when the server drains this connection.
	shutdown atomic.Bool
	// idle is set when the idle timer closes the connection.
	idle atomic.Bool
	// leaseLost is set when the node lost its lease while this
	// connection held a binding: the read loop ends with bye{lease_lost}.
	leaseLost atomic.Bool
	// served is pc once the hello is welcomed, for requestLeaseLost,
	// which runs on another goroutine.
	served atomic.Pointer[participant.Conn]
	// active is when the connection last read a frame or answered a
	// request, in unix nanoseconds.
	active atomic.Int64
	// idleTimer checks idleness; nil when IdleTimeout is off. ended, set
	// by teardown, keeps it from being set again.
	idleTimer *time.Timer
	ended     atomic.Bool
	// abandon makes workers drop the requests still queued.
	abandon atomic.Bool
	// overBudget is set when the pending budget cut the frame whose body
	// was arriving (shares.go): the read loop ends with
	// rejected{overloaded}. arriving is that frame's bytes held, 0 when
	// none is arriving.
	overBudget atomic.Bool
	arriving   atomic.Int64

	// Set by the handshake, before any other goroutine of this connection
	// starts.
	pc   *participant.Conn
	out  *outq
	wake chan struct{}
	quit chan struct{} // closed to stop the pump and waiting submitters

	pumpDone chan struct{}
	pending  chan struct{} // a slot per request queued or running
	// pendingBytes holds the frame bytes of the requests queued or running;
	// pendingShare is what its principal holds of the server's.
	pendingBytes *budget
	pendingShare *holder
	workers      sync.WaitGroup

	// mu guards queues and the convQueues in it.
	mu sync.Mutex
	// queues holds, per conversation with requests read and not yet
	// answered, what dispatch.go needs to run them in order.
	// +checklocks:mu
	queues map[uint64]*convQueue
}

// request is a request read and not yet answered, with the frame bytes it
// holds of the pending budgets.
type request struct {
	m    wire.Operation
	held int64
	// read is when its frame was read off the socket.
	read time.Time
}

// reasonTLSHandshake counts, among the refused connections, those whose TLS
// handshake failed or timed out: they get no rejected frame.
const reasonTLSHandshake wire.Reason = "tls_handshake"

// closing says how a connection ended.
type closing struct {
	cause  oplog.Cause
	final  wire.Message // sent last, or nil
	reason string       // for the log
	err    error
}

// maxHelloFrame bounds the first frame, read before the client is known
// (before auth), far below max_frame: a hello holds at most 256 versions, a
// token and a client name.
const maxHelloFrame = 16 << 10

// helloBuffer and readBuffer are the sizes of a connection's read buffer
// before and after hello. A smaller read than the buffer goes through it;
// a body larger than the buffer is read into the body directly, so a small
// buffer costs syscalls only on many small frames sent together. Only a
// socket nobody has authenticated is kept small: a welcomed one gets the
// full buffer, which costs little resident memory (pages the reads never
// reach stay untouched) but is heap the collector paces against: at
// 16 KiB the tell benchmark at window 1 collected twice as often per tell
// (BENCHMARKS.md, "This round against its base").
const (
	helloBuffer = 512
	readBuffer  = 64 << 10
)

// maxLoggedString bounds a client-supplied string (hello.client, a type
// name in a refusal) in the log and in a rejected detail.
const maxLoggedString = 128

func newConn(s *Server, nc net.Conn, peer netip.Prefix, limited bool, creates *creations) *conn {
	br := bufio.NewReaderSize(nc, helloBuffer)
	return &conn{
		srv:     s,
		nc:      nc,
		br:      br,
		hrd:     wire.NewReader(br, maxHelloFrame),
		start:   time.Now(),
		log:     s.log.With().Str("remote", nc.RemoteAddr().String()).Logger(),
		peer:    peer,
		limited: limited,
		creates: creates,
	}
}

// allowCreate takes one conversation creation from the connection's
// bucket.
func (c *conn) allowCreate() bool { return c.creates.take(time.Now()) }

// createsExhausted reports whether allowCreate would refuse now.
func (c *conn) createsExhausted() bool { return c.creates.exhausted(time.Now()) }

// requestShutdown makes the connection tear down as drained: its pending
// read fails at once, and serve, seeing the flag, sends bye.
func (c *conn) requestShutdown() {
	c.shutdown.Store(true)
	if w, ok := c.nc.(*wsConn); ok {
		w.goingAway()
	}
	c.nc.SetReadDeadline(time.Now())
}

// requestLeaseLost ends the connection with bye{lease_lost} if it holds a
// binding or may (participant.Conn.MayHoldBinding: an enroll or attach in
// flight or in doubt, whose client may believe it bound); it never blocks
// (the node's keep-alive calls it).
func (c *conn) requestLeaseLost() {
	if pc := c.served.Load(); pc == nil || !pc.MayHoldBinding() {
		return
	}
	c.leaseLost.Store(true)
	c.nc.SetReadDeadline(time.Now())
}

// clip bounds a client-supplied string before it is logged or echoed.
func clip(s string) string {
	if len(s) <= maxLoggedString {
		return s
	}
	cut := maxLoggedString
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:cut], len(s))
}

// serve runs the connection to its end. The TLS handshake and hello run
// under the deadline admit set.
func (c *conn) serve() {
	if tc := tlsOf(c.nc); tc != nil {
		if err := tc.Handshake(); err != nil {
			// Nothing can be said to a peer without TLS.
			c.srv.metrics.refused(reasonTLSHandshake)
			c.log.Debug().Err(err).Msg("TLS handshake failed")
			c.nc.Close()
			return
		}
	}
	reason, detail, hello := c.handshake()
	if reason != "" {
		// The hello deadline may be what ended the handshake.
		c.nc.SetDeadline(time.Now().Add(c.srv.refuseTimeout()))
		c.srv.refuse(c.nc, reason, detail)
		return
	}
	if hello == nil {
		c.nc.Close()
		return
	}
	c.welcomeBuffers()
	svc := c.srv.svc.Load()
	c.wake = make(chan struct{}, 1)
	c.quit = make(chan struct{})
	c.pumpDone = make(chan struct{})
	c.pending = make(chan struct{}, c.srv.cfg.MaxPending)
	c.pendingBytes = newBudget(int64(c.srv.cfg.MaxPendingBytes))
	c.queues = make(map[uint64]*convQueue) // +checklocksignore: the workers that share it start below
	principal := c.principal()
	c.pendingShare = c.srv.pendingBytes.join(string(principal))
	defer c.pendingShare.leave()
	outShare := c.srv.outBytes.join(string(principal))
	defer outShare.leave()
	c.pc = svc.ConnectAs(principal, func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	})
	c.pc.LimitCreates(participant.CreateLimit{
		Allow:     c.allowCreate,
		Exhausted: c.createsExhausted,
		Rate:      c.srv.cfg.ConversationRate,
		Burst:     c.srv.cfg.ConversationBurst,
	})
	c.served.Store(c.pc)
	ordinal := c.pc.ID().Ordinal
	c.log = c.log.With().Uint64("connection", ordinal).Logger()
	client := ""
	if hello.Client != nil {
		client = clip(*hello.Client)
	}
	c.out = newOutq(c.nc, c.srv.cfg.WriteProgressTimeout, newBudget(int64(c.srv.cfg.MaxOutboundBytes)), outShare, c.quit)
	window, skew := c.srv.tokenWindow()
	c.out.send(&wire.Welcome{
		Version:        wire.Version,
		Server:         "participantd " + Version,
		Incarnation:    svc.Incarnation(),
		Connection:     ordinal,
		MaxFrame:       uint64(c.srv.cfg.MaxFrame),
		MaxRecordBytes: uint64(c.srv.cfg.MaxRecordBytes),
		Node:           c.srv.nodeID(),
		TokenWindow:    window,
		TokenSkew:      skew,
	})
	c.log.Info().Str("client", client).Msg("connection opened")
	go c.pump()

	// Lift the hello deadline, unless a drain set its own meanwhile; the
	// writer sets write deadlines of its own.
	c.nc.SetDeadline(time.Time{})
	if c.shutdown.Load() {
		c.nc.SetReadDeadline(time.Now())
	}
	c.touch()
	if d := c.srv.cfg.IdleTimeout; d > 0 {
		c.idleTimer = time.AfterFunc(d, c.checkIdle)
	}
	cl := c.readLoop()
	c.teardown(cl)
}

// welcomeBuffers gives a welcomed connection its read buffer of
// readBuffer bytes, keeping what the hello buffer holds beyond hello (a
// client may send requests right behind it), and lets the hello reader's
// buffer go.
func (c *conn) welcomeBuffers() {
	var r io.Reader = c.nc
	if n := c.br.Buffered(); n > 0 {
		rest, _ := c.br.Peek(n)
		r = io.MultiReader(bytes.NewReader(bytes.Clone(rest)), c.nc)
	}
	c.br = bufio.NewReaderSize(r, readBuffer)
	c.hrd = nil
	c.rd = wire.NewReader(c.br, c.srv.cfg.MaxFrame)
}

// principal names who the connection acts for, for the shares of the
// service-wide budgets: the identity of its verified client certificate
// under mutual TLS (certIdentity: its first URI SAN, such as a SPIFFE
// id, else its subject, and its issuer), whatever its address, so that
// one client is one share however many addresses it comes from; else its address where the per-address
// limits apply, and nobody where they do not (loopback, by default).
func (c *conn) principal() participant.Principal {
	if id := certPrincipal(c.nc); id != "" {
		return participant.Principal(id)
	}
	if c.limited {
		return participant.Principal(c.peer.String())
	}
	return ""
}

// tlsOf returns the TLS connection nc runs over, beneath a WebSocket's
// too, or nil.
func tlsOf(nc net.Conn) *tls.Conn {
	if w, ok := nc.(*wsConn); ok {
		nc = w.raw
	}
	tc, _ := nc.(*tls.Conn)
	return tc
}

// touch records activity, a frame read or a request answered, and
// returns its time.
func (c *conn) touch() time.Time {
	now := time.Now()
	c.active.Store(now.UnixNano())
	return now
}

// checkIdle runs on the idle timer. A connection is idle when it holds no
// binding, nor may (participant.Conn.MayHoldBinding: an enroll or attach
// in doubt may have stored one, which its conversation's next load binds
// here), so that no delivery can be due to it and bye{idle} says truly
// that it held none; when it has no request queued or running and nothing
// queued to write; and when it read no frame and answered no request for
// IdleTimeout: it is then closed with bye{idle}. Otherwise the timer is
// set again for when it could first be.
func (c *conn) checkIdle() {
	if c.ended.Load() {
		return
	}
	d := c.srv.cfg.IdleTimeout
	since := time.Since(time.Unix(0, c.active.Load()))
	if since >= d && len(c.pending) == 0 && c.out.empty() && !c.pc.MayHoldBinding() {
		c.idle.Store(true)
		c.nc.SetReadDeadline(time.Now())
		return
	}
	c.idleTimer.Reset(max(d-since, d/8))
}

// tokenWindow is welcome.token_window and welcome.token_skew: the window
// and skew in the milliseconds the service enforces them in
// (participant's admitToken truncates both to milliseconds), or nil and
// nil when the server runs no window, so that such a server's welcome is
// the one it sent before the fields existed.
func (s *Server) tokenWindow() (window, skew *uint64) {
	if s.cfg.TokenWindow <= 0 {
		return nil, nil
	}
	return new(uint64(s.cfg.TokenWindow.Milliseconds())), new(uint64(s.cfg.TokenSkew.Milliseconds()))
}

// handshake reads hello and checks it, under the deadline admit set. It
// returns the rejection reason and detail, or hello.
func (c *conn) handshake() (wire.Reason, string, *wire.Hello) {
	body, err := c.hrd.ReadFrame()
	if c.shutdown.Load() {
		return wire.ReasonShuttingDown, "the server is shutting down", nil
	}
	if err != nil {
		switch {
		case errors.Is(err, wire.ErrFrameTooLarge):
			return wire.ReasonFrameTooLarge, err.Error(), nil
		case errors.Is(err, io.EOF):
			return "", "", nil // gone before saying anything
		case errors.Is(err, os.ErrDeadlineExceeded):
			return wire.ReasonHelloRequired, fmt.Sprintf("no hello within %v", c.srv.cfg.HelloTimeout), nil
		}
		return wire.ReasonHelloRequired, "no hello: " + err.Error(), nil
	}
	m, err := wire.DecodeRequest(body)
	if err != nil {
		var de *wire.DecodeError
		errors.As(err, &de)
		switch {
		case de == nil:
			return wire.ReasonMalformed, clip(err.Error()), nil
		case de.Type == wire.TypeHello:
			return wire.ReasonMalformed, clip(de.Detail), nil
		case de.Type != "":
			return wire.ReasonHelloRequired, fmt.Sprintf("the first frame is %q, not hello", clip(de.Type)), nil
		default:
			return wire.ReasonMalformed, clip(de.Detail), nil
		}
	}
	hello, ok := m.(*wire.Hello)
	if !ok {
		return wire.ReasonHelloRequired, fmt.Sprintf("the first frame is %q, not hello", clip(m.Type())), nil
	}
	if !slices.Contains(hello.Versions, wire.Version) {
		return wire.ReasonUnsupportedVersion, fmt.Sprintf("this server speaks version %d only", wire.Version), nil
	}
	if reason, detail := c.srv.checkAuth(c.nc.RemoteAddr(), isWS(c.nc), hello.Auth); reason != "" {
		return reason, detail, nil
	}
	if reason, detail := c.srv.admitCert(c); reason != "" {
		return reason, detail, nil
	}
	if c.srv.svc.Load() == nil {
		return wire.ReasonShuttingDown, "the server is not serving", nil
	}
	return "", "", hello
}

// readLoop reads requests until the connection ends, and says how.
func (c *conn) readLoop() closing {
	for {
		held, waited, ok := c.reserve()
		if !ok {
			return closing{cause: oplog.CauseConnectionLost, reason: "write failed"}
		}
		body, err := c.rd.ReadFrame()
		if waited {
			c.arrived()
		}
		if err != nil {
			c.release(held)
			switch {
			case c.overBudget.Load():
				c.srv.metrics.refused(wire.ReasonOverloaded)
				return closing{cause: oplog.CauseConnectionLost, reason: "pending budget full",
					final: &wire.Rejected{Reason: wire.ReasonOverloaded, Detail: "the server's budget of pending request bytes is full and your principal holds the most of it: a frame still arriving was cut"}}
			case c.shutdown.Load():
				return closing{cause: oplog.CauseShutdown, final: &wire.ServerBye{Reason: wire.ByeShutdown}, reason: "shutdown"}
			case c.idle.Load():
				return closing{cause: oplog.CauseConnectionLost, final: &wire.ServerBye{Reason: wire.ByeIdle}, reason: "idle"}
			case c.leaseLost.Load():
				return closing{cause: oplog.CauseConnectionLost, final: &wire.ServerBye{Reason: wire.ByeLeaseLost}, reason: "lease lost"}
			case errors.Is(err, os.ErrDeadlineExceeded):
				return closing{cause: oplog.CauseConnectionLost, reason: "frame read timeout", err: err}
			case errors.Is(err, wire.ErrFrameTooLarge):
				return c.violation(wire.ReasonFrameTooLarge, err.Error())
			case errors.Is(err, errWSText), errors.Is(err, errWSSplit):
				// The peer broke the WebSocket mapping: its protocol
				// error, as a malformed frame is over TCP.
				return c.violation(wire.ReasonMalformed, err.Error())
			case errors.Is(err, io.EOF):
				return closing{cause: oplog.CauseConnectionLost, reason: "eof"}
			default:
				return closing{cause: oplog.CauseConnectionLost, reason: "read error", err: err}
			}
		}
		read := c.touch()
		m, err := wire.DecodeRequest(body)
		if err != nil {
			c.release(held)
			var de *wire.DecodeError
			if errors.As(err, &de) && de.Class == wire.BadRequest && de.HasID {
				c.srv.metrics.badRequest()
				c.out.send(&wire.Error{ID: de.ID, Code: wire.CodeBadRequest, Detail: clip(de.Detail)})
				continue
			}
			return c.violation(wire.ReasonMalformed, clip(err.Error()))
		}
		switch m := m.(type) {
		case *wire.Hello:
			c.release(held)
			return c.violation(wire.ReasonMalformed, "a second hello")
		case *wire.Bye:
			c.release(held)
			return closing{cause: oplog.CauseClean, reason: "bye"}
		case *wire.Ping:
			c.release(held)
			c.out.send(&wire.Pong{ID: m.ID})
		case wire.Operation:
			if !c.submit(m.ConversationID(), m, held, read) {
				return closing{cause: oplog.CauseConnectionLost, reason: "write failed"}
			}
		default:
			panic("server: no handler for " + m.Type())
		}
	}
}

// reserve waits for the next frame's header and takes its announced size
// of the pending budgets (the connection's, and its principal's share of
// the server's) before its body is read, so that frames still arriving
// count as much as frames read: a peer cannot make the server hold more
// than the budgets by sending many bodies slowly. The body must then
// arrive within FrameReadTimeout, so that a slow peer cannot sit on the
// budget either; while it arrives, a full server budget may cut it for a
// principal that holds less (shares.go).
// It returns the bytes held (0 when the header could not be read or
// announces more than MaxFrame: ReadFrame then reports it), whether it set
// a deadline on the body (not when the body is buffered already, as
// pipelined frames are), and false if the connection's writer is gone
// while it waited.
func (c *conn) reserve() (held int64, deadline, ok bool) {
	hdr, err := c.br.Peek(wire.HeaderLen)
	if err != nil {
		return 0, false, true
	}
	n := int64(binary.BigEndian.Uint32(hdr))
	if n == 0 || n > int64(c.srv.cfg.MaxFrame) {
		return 0, false, true
	}
	held = min(n, c.pendingBytes.limit)
	if !take(held, c.out.done, nil, c.pendingBytes, c.pendingShare) {
		return 0, false, false
	}
	if c.br.Buffered() < wire.HeaderLen+int(n) {
		c.nc.SetReadDeadline(time.Now().Add(c.srv.cfg.FrameReadTimeout))
		c.recheckDeadline()
		c.arriving.Store(held)
		c.pendingShare.mayCut(c)
		deadline = true
	}
	return held, deadline, true
}

// arrived ends what reserve began for a body that was still arriving: it
// can no longer be cut, and its deadline is lifted.
func (c *conn) arrived() {
	c.pendingShare.unmayCut(c)
	c.arriving.Store(0)
	c.nc.SetReadDeadline(time.Time{})
	c.recheckDeadline()
}

// cut ends the frame whose body is arriving, for the pending budget
// (shares.go): the read fails at once, and the read loop ends with
// rejected{overloaded}.
func (c *conn) cut() {
	c.overBudget.Store(true)
	c.nc.SetReadDeadline(time.Now())
}

// size is what the frame whose body is arriving holds.
func (c *conn) size() int64 { return c.arriving.Load() }

// recheckDeadline keeps the read deadline a drain, the idle timer, a
// lost lease or a cut set while the reader changed it.
func (c *conn) recheckDeadline() {
	if c.shutdown.Load() || c.idle.Load() || c.leaseLost.Load() || c.overBudget.Load() {
		c.nc.SetReadDeadline(time.Now())
	}
}

// release gives back bytes reserve took for a frame that is not a queued
// request.
func (c *conn) release(held int64) {
	if held > 0 {
		c.pendingBytes.give(held)
		c.pendingShare.give(held)
	}
}

// violation is the closing of a connection that broke the protocol after
// welcome.
func (c *conn) violation(reason wire.Reason, detail string) closing {
	c.srv.metrics.refused(reason)
	return closing{
		cause:  oplog.CauseProtocolError,
		final:  &wire.Rejected{Reason: reason, Detail: detail},
		reason: string(reason),
		err:    errors.New(detail),
	}
}

// teardown ends the connection as cl says: see the package documentation.
func (c *conn) teardown(cl closing) {
	if c.idleTimer != nil {
		c.ended.Store(true)
		c.idleTimer.Stop()
	}
	// A connection closed for idleness answers what it read, as a drain
	// does: the peer gets bye, not a cut.
	if cl.cause == oplog.CauseConnectionLost && cl.final == nil || cl.cause == oplog.CauseProtocolError {
		c.abandon.Store(true)
	}
	// Requests read before the end are answered (or dropped) before the
	// last frame, so that it stays last.
	c.workers.Wait()
	close(c.quit)
	<-c.pumpDone
	c.out.finish(cl.final)
	if err := c.pc.End(c.srv.opCtx, cl.cause); err != nil {
		c.log.Warn().Err(err).Stringer("cause", cl.cause).Msg("ending the connection's bindings failed; they end at the next start")
	}
	if cl.final != nil {
		lingerClose(c.nc)
	} else {
		c.nc.Close()
	}
	ev := c.log.Info()
	if cl.cause == oplog.CauseProtocolError {
		ev = c.log.Warn()
	}
	if c.out.cut.Load() {
		ev = c.log.Warn()
		cl.reason = "write progress timeout"
	}
	if c.out.shed.Load() {
		ev = c.log.Warn()
		cl.reason = "outbound budget full"
	}
	ev.Str("reason", cl.reason).AnErr("error", cl.err).Dur("duration_ms", time.Since(c.start)).
		Uint64("frames_out", c.out.frames.Load()).Msg("connection closed")
}

// lingerClose closes nc after sending what was written: it half-closes the
// write side, then discards what the peer still sends for a short while,
// so that the peer reads the last frame instead of a reset.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		io.CopyN(io.Discard, nc, 1<<20)
	}
	nc.Close()
}
