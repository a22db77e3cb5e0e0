package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/participantd/participantd/wire"
)

// Welcome is what the server announced for the current connection.
type Welcome struct {
	Server         string
	Incarnation    uint64 // one more at every start of the server
	Connection     uint64 // the connection's ordinal within the incarnation
	MaxFrame       uint64
	MaxRecordBytes uint64
	// TokenWindow is the server's token window (docs/PROTOCOL.md, Token
	// window), zero when the server runs none. Under a window every token
	// must be a UUIDv7, which NewToken always draws, and one older than
	// TokenWindow that the server does not find committed is refused
	// ErrTokenExpired: keep the retries of one operation far shorter.
	// The server announces it in whole milliseconds (a window is at least
	// one).
	TokenWindow time.Duration
	// TokenSkew is how far ahead of the server's clock a token's time may
	// be under the window before it is refused ErrTokenInvalid; zero
	// when the server runs no window.
	TokenSkew time.Duration
	// Node is the cluster node's id; empty from a single server.
	Node string
}

// welcomeOf returns what m announces.
func welcomeOf(m *wire.Welcome) Welcome {
	w := Welcome{
		Server: m.Server, Incarnation: m.Incarnation, Connection: m.Connection,
		MaxFrame: m.MaxFrame, MaxRecordBytes: m.MaxRecordBytes, Node: m.Node,
	}
	if m.TokenWindow != nil {
		w.TokenWindow = msDuration(*m.TokenWindow)
	}
	if m.TokenSkew != nil {
		w.TokenSkew = msDuration(*m.TokenSkew)
	}
	return w
}

// msDuration converts ms milliseconds to a Duration, saturating at the
// largest one (about 292 years) rather than overflowing.
func msDuration(ms uint64) time.Duration {
	const most = uint64(math.MaxInt64 / int64(time.Millisecond))
	if ms > most {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// errLost is a session's end as seen by a call on it.
var errLost = errors.New("client: connection lost before the answer")

// errIdle ends a session the server closed for idleness (bye{idle}): a
// normal end, which the client neither reports nor backs off from.
var errIdle = errors.New("client: the server closed the idle connection")

// session is one live connection: the handshake done, a reader goroutine
// matching answers to pending calls by id.
type session struct {
	wc      *wire.Conn
	welcome Welcome
	seq     uint64 // ordinal of the session within the client, from 1
	// answerTimeout bounds the wait for one answer (Options.AnswerTimeout);
	// zero or negative: none.
	answerTimeout time.Duration

	dead chan struct{} // closed when the connection ended

	// mu guards pending and err.
	mu      sync.Mutex
	pending map[uint64]chan wire.Message
	err     error // why the session ended; set once
}

// dial connects and runs the handshake. The returned session has no reader
// yet: the caller starts run.
func dial(ctx context.Context, addr string, o *Options, seq uint64) (*session, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	var nc net.Conn
	var err error
	d := &net.Dialer{}
	if o.TLS != nil {
		td := &tls.Dialer{NetDialer: d, Config: o.TLS}
		nc, err = td.DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w%s", addr, err, tlsHint(o, err))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	wc := wire.NewConn(nc, wire.ConnOptions{})
	hello := &wire.Hello{Versions: []uint64{wire.Version}}
	if o.AuthToken != "" {
		hello.Auth = &o.AuthToken
	}
	if o.ClientName != "" {
		hello.Client = &o.ClientName
	}
	if err := wc.WriteMessage(hello); err != nil {
		wc.Close()
		return nil, fmt.Errorf("client: hello to %s: %w", addr, err)
	}
	m, err := wc.ReadServerMessage()
	if err != nil {
		wc.Close()
		// The socket's deadline is ctx's (a cancel moves it to the past
		// after ctx.Err is set), so a timeout with ctx not canceled is
		// the deadline passing, which the read may see before ctx does.
		if errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(ctx.Err(), context.Canceled) {
			return nil, noWelcome(ctx, addr, start, err)
		}
		return nil, fmt.Errorf("client: handshake with %s: %w%s", addr, err, tlsHint(o, err))
	}
	switch m := m.(type) {
	case *wire.Welcome:
		if m.Version != wire.Version {
			wc.Close()
			return nil, fmt.Errorf("%w: welcome announces version %d", ErrProtocol, m.Version)
		}
		if !stop() {
			wc.Close()
			return nil, fmt.Errorf("client: handshake with %s: %w", addr, ctx.Err())
		}
		_ = nc.SetDeadline(time.Time{})
		if m.MaxFrame > 0 {
			wc.SetMaxWriteFrame(int(min(m.MaxFrame, 1<<32-1)))
		}
		return &session{
			wc:            wc,
			seq:           seq,
			answerTimeout: o.AnswerTimeout,
			welcome:       welcomeOf(m),
			dead:          make(chan struct{}),
			pending:       make(map[uint64]chan wire.Message),
		}, nil
	case *wire.Rejected:
		wc.Close()
		return nil, &RejectedError{Reason: m.Reason, Detail: m.Detail}
	default:
		wc.Close()
		return nil, fmt.Errorf("%w: %s before welcome", ErrProtocol, m.Type())
	}
}

// noWelcome is the error of a handshake whose deadline passed before the
// welcome came (err, the read's). A participantd answers hello at once,
// rejected when it is full or draining; the likely cause is an address
// that is not its protocol listener: an HTTP server (participantd's
// health listener, say) waits for a request line the hello never
// completes, and answers nothing. The error unwraps to err.
func noWelcome(ctx context.Context, addr string, start time.Time, err error) error {
	waited := time.Since(start)
	if dl, ok := ctx.Deadline(); ok {
		waited = dl.Sub(start)
	}
	return fmt.Errorf("client: no welcome from %s within %v of connecting: is it participantd's protocol listener "+
		"(participantd --listen, default port 7420)? An HTTP listener such as participantd's health listener "+
		"(--health-listen, default port 7421) answers nothing to the protocol's hello; else the server is "+
		"overloaded or stuck (its /ready and logs say which): %w", addr, waited.Round(time.Millisecond), err)
}

// tlsHint is what to add to the error of a handshake that failed the way
// a TLS mismatch fails: a server that serves TLS closes a plaintext
// connection at its first bytes (the client reads EOF or a reset); a
// plaintext server cannot answer a TLS client hello.
func tlsHint(o *Options, err error) string {
	var rec tls.RecordHeaderError
	switch {
	case o.TLS == nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
		return " (the server closed the connection at once: does it serve TLS? connect with TLS, Options.TLS or participantctl --tls-ca)"
	case o.TLS != nil && (errors.As(err, &rec) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		return " (the TLS handshake failed: does the server serve TLS? a server without --tls-cert speaks plaintext)"
	}
	return ""
}

// run reads the connection until it ends: answers go to their pending call,
// deliveries to deliver and compacted pushes to compacted, in the order
// they came. It ends the session and returns why.
func (s *session) run(deliver func(*wire.Delivery), compacted func(*wire.Compacted)) error {
	for {
		m, err := s.wc.ReadServerMessage()
		if errors.Is(err, wire.ErrBadRequest) {
			// An unknown message type: skip it, for forward compatibility.
			var de *wire.DecodeError
			if errors.As(err, &de) && de.Field == "t" {
				continue
			}
		}
		if err != nil {
			return s.end(err)
		}
		switch m := m.(type) {
		case *wire.Delivery:
			deliver(m)
		case *wire.Compacted:
			compacted(m)
		case *wire.ServerBye:
			if m.Reason == wire.ByeIdle {
				return s.end(errIdle)
			}
			return s.end(fmt.Errorf("client: server said bye (%s)", m.Reason))
		case *wire.Rejected:
			return s.end(&RejectedError{Reason: m.Reason, Detail: m.Detail})
		default:
			id, ok := wire.ID(m)
			if !ok {
				return s.end(fmt.Errorf("%w: unexpected %s", ErrProtocol, m.Type()))
			}
			s.mu.Lock()
			ch := s.pending[id]
			delete(s.pending, id)
			s.mu.Unlock()
			if ch != nil {
				ch <- m // buffered, one answer per id
			}
		}
	}
}

// end records why the session ended, closes the connection and wakes every
// pending call. It returns the first recorded reason.
func (s *session) end(why error) error {
	s.mu.Lock()
	first := s.err == nil
	if first {
		s.err = why
	}
	why = s.err
	s.mu.Unlock()
	if first {
		s.wc.Close()
		close(s.dead)
	}
	return why
}

// errNoAnswer ends a session on which a request waited past
// Options.AnswerTimeout for its answer.
var errNoAnswer = errors.New("client: no answer within the answer timeout; connection taken for lost")

// call sends m, which carries id, and waits for its answer. wrote reports
// whether any of m may have reached the server: false only when m was
// refused before its first byte was written. Errors: errLost when the
// connection ends before the answer (m may or may not have reached the
// server), or no answer came within the session's answer timeout (the
// session is ended); a too_large *Error for a frame over max_frame
// (nothing written); ctx's error.
func (s *session) call(ctx context.Context, id uint64, m wire.Message) (ans wire.Message, wrote bool, err error) {
	ch := make(chan wire.Message, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, false, errLost
	}
	s.pending[id] = ch
	s.mu.Unlock()
	if err := s.wc.WriteMessage(m); err != nil {
		s.forget(id)
		if errors.Is(err, wire.ErrFrameTooLarge) {
			// Refused before anything was written: final, as the
			// server's rejected{frame_too_large} would be.
			return nil, false, &Error{Code: CodeTooLarge, Detail: fmt.Sprintf("%s: %v", m.Type(), err), err: err}
		}
		s.end(err)
		return nil, true, errLost
	}
	var timeout <-chan time.Time
	if s.answerTimeout > 0 {
		t := time.NewTimer(s.answerTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case a := <-ch:
		return a, true, nil
	case <-s.dead:
		select {
		case a := <-ch:
			return a, true, nil
		default:
			return nil, true, errLost
		}
	case <-timeout:
		s.forget(id)
		s.end(errNoAnswer)
		return nil, true, errLost
	case <-ctx.Done():
		s.forget(id)
		return nil, true, ctx.Err()
	}
}

func (s *session) forget(id uint64) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// reason returns why the session ended, or nil while it lives.
func (s *session) reason() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *session) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return true
	}
}
