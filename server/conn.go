package server

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// conn serves one accepted connection; see the package documentation for
// its goroutines and teardown.
type conn struct {
	srv   *Server
	nc    net.Conn
	rd    *wire.Reader
	start time.Time
	log   zerolog.Logger

	// shutdown is set when the server drains this connection.
	shutdown atomic.Bool
	// abandon makes workers drop the requests still queued.
	abandon atomic.Bool

	// Set by the handshake, before any other goroutine of this connection
	// starts.
	pc   *participant.Conn
	out  *outq
	wake chan struct{}
	quit chan struct{} // closed to stop the pump and waiting submitters

	pumpDone chan struct{}
	pending  chan struct{} // a slot per request queued or running
	// pendingBytes holds the frame bytes of the requests queued or running.
	pendingBytes *budget
	workers      sync.WaitGroup

	// mu guards queues.
	mu sync.Mutex
	// queues holds, per conversation with a worker, the requests it has
	// still to run, in the order read.
	queues map[uint64][]request
}

// request is a request read and not yet answered, with the frame bytes it
// holds of the pending budgets.
type request struct {
	m    wire.Message
	held int64
}

// closing says how a connection ended.
type closing struct {
	cause  oplog.Cause
	final  wire.Message // sent last, or nil
	reason string       // for the log
	err    error
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		srv:   s,
		nc:    nc,
		rd:    wire.NewReader(bufio.NewReaderSize(nc, 64<<10), s.cfg.MaxFrame),
		start: time.Now(),
		log:   s.log.With().Str("remote", nc.RemoteAddr().String()).Logger(),
	}
}

// requestShutdown makes the connection tear down as drained: its pending
// read fails at once, and serve, seeing the flag, sends bye.
func (c *conn) requestShutdown() {
	c.shutdown.Store(true)
	c.nc.SetReadDeadline(time.Now())
}

// serve runs the connection to its end.
func (c *conn) serve() {
	reason, detail, hello := c.handshake()
	if reason != "" {
		c.srv.refuse(c.nc, reason, detail)
		return
	}
	if hello == nil {
		c.nc.Close()
		return
	}
	svc := c.srv.svc.Load()
	c.wake = make(chan struct{}, 1)
	c.quit = make(chan struct{})
	c.pumpDone = make(chan struct{})
	c.pending = make(chan struct{}, c.srv.cfg.MaxPending)
	c.pendingBytes = newBudget(int64(c.srv.cfg.MaxPendingBytes))
	c.queues = make(map[uint64][]request)
	c.pc = svc.Connect(func() {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	})
	ordinal := c.pc.ID().Ordinal
	c.log = c.log.With().Uint64("connection", ordinal).Logger()
	client := ""
	if hello.Client != nil {
		client = *hello.Client
	}
	c.out = newOutq(c.nc, c.srv.cfg.WriteProgressTimeout, newBudget(int64(c.srv.cfg.MaxOutboundBytes)), c.srv.outBytes, c.quit)
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

	// Lift the hello deadline, unless a drain set its own meanwhile.
	c.nc.SetReadDeadline(time.Time{})
	if c.shutdown.Load() {
		c.nc.SetReadDeadline(time.Now())
	}
	cl := c.readLoop()
	c.teardown(cl)
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

// handshake reads hello and checks it. It returns the rejection reason
// and detail, or hello.
func (c *conn) handshake() (wire.Reason, string, *wire.Hello) {
	c.nc.SetReadDeadline(time.Now().Add(c.srv.cfg.HelloTimeout))
	body, err := c.rd.ReadFrame()
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
			return wire.ReasonMalformed, err.Error(), nil
		case de.Type == wire.TypeHello:
			return wire.ReasonMalformed, de.Detail, nil
		case de.Type != "":
			return wire.ReasonHelloRequired, fmt.Sprintf("the first frame is %q, not hello", de.Type), nil
		default:
			return wire.ReasonMalformed, de.Detail, nil
		}
	}
	hello, ok := m.(*wire.Hello)
	if !ok {
		return wire.ReasonHelloRequired, fmt.Sprintf("the first frame is %q, not hello", m.Type()), nil
	}
	if !slices.Contains(hello.Versions, wire.Version) {
		return wire.ReasonUnsupportedVersion, fmt.Sprintf("this server speaks version %d only", wire.Version), nil
	}
	if tok := c.srv.cfg.AuthToken; tok != "" {
		// Hashing first makes the comparison constant-time in the length
		// too.
		want := sha256.Sum256([]byte(tok))
		var got [32]byte
		if hello.Auth != nil {
			got = sha256.Sum256([]byte(*hello.Auth))
		}
		if hello.Auth == nil || subtle.ConstantTimeCompare(want[:], got[:]) != 1 {
			return wire.ReasonAuthFailed, "wrong or missing auth token", nil
		}
	}
	if c.srv.svc.Load() == nil {
		return wire.ReasonShuttingDown, "the server is not serving", nil
	}
	return "", "", hello
}

// readLoop reads requests until the connection ends, and says how.
func (c *conn) readLoop() closing {
	for {
		body, err := c.rd.ReadFrame()
		if err != nil {
			switch {
			case c.shutdown.Load():
				return closing{cause: oplog.CauseShutdown, final: &wire.ServerBye{Reason: wire.ByeShutdown}, reason: "shutdown"}
			case errors.Is(err, wire.ErrFrameTooLarge):
				return c.violation(wire.ReasonFrameTooLarge, err.Error())
			case errors.Is(err, io.EOF):
				return closing{cause: oplog.CauseConnectionLost, reason: "eof"}
			default:
				return closing{cause: oplog.CauseConnectionLost, reason: "read error", err: err}
			}
		}
		m, err := wire.DecodeRequest(body)
		if err != nil {
			var de *wire.DecodeError
			if errors.As(err, &de) && de.Class == wire.BadRequest && de.HasID {
				c.srv.metrics.badRequest()
				c.out.send(&wire.Error{ID: de.ID, Code: wire.CodeBadRequest, Detail: de.Detail})
				continue
			}
			return c.violation(wire.ReasonMalformed, err.Error())
		}
		switch m := m.(type) {
		case *wire.Hello:
			return c.violation(wire.ReasonMalformed, "a second hello")
		case *wire.Bye:
			return closing{cause: oplog.CauseClean, reason: "bye"}
		case *wire.Ping:
			c.out.send(&wire.Pong{ID: m.ID})
		default:
			if !c.submit(conversationOf(m), m, int64(len(body))) {
				return closing{cause: oplog.CauseConnectionLost, reason: "write failed"}
			}
		}
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
	if cl.cause == oplog.CauseConnectionLost || cl.cause == oplog.CauseProtocolError {
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
