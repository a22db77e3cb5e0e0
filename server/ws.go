package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// maxUpgradeRequest bounds the HTTP upgrade request of a WebSocket
// connection: its request line and headers, read before anything is known
// of the peer.
const maxUpgradeRequest = 16 << 10

// Errors of a WebSocket connection, as its reads report them.
var (
	errWSText  = errors.New("websocket: a text message (the protocol is binary messages only)")
	errWSSplit = errors.New("websocket: a message that is not exactly one frame")
)

// wsConn carries the wire protocol over one WebSocket connection, so that
// the connection code (conn.go) serves it as it serves a TCP stream: its
// reads and writes are the same frames (PROTOCOL.md, WebSocket), each one
// binary message holding one whole frame, length prefix included.
//
// The HTTP upgrade runs on the first Read or Write, that is inside the
// connection's first read of hello (or a refusal's write), under the
// deadline admit set on the raw connection: a slow upgrade is a slow hello.
// Deadlines are the raw connection's, which the library reads and writes.
type wsConn struct {
	raw     net.Conn // the TCP or TLS connection under the WebSocket
	origins []string

	once    sync.Once
	ws      *websocket.Conn
	upErr   error
	msg     io.Reader // the message being read; nil between messages
	msgEOF  bool      // msg reported its end (reading on would read the next one)
	rerr    error     // the error that ended reading, returned from then on
	left    int64     // bytes of msg's frame still to pass on
	hdr     [4]byte   // the header of msg's frame, as read
	hdrN    int       // bytes of hdr read so far
	pending []byte    // written bytes not yet a whole frame

	// code is the close code sent when the connection closes:
	// StatusNormalClosure, or StatusGoingAway once the server drains.
	code atomic.Int32
}

func newWSConn(raw net.Conn, origins []string) *wsConn {
	w := &wsConn{raw: raw, origins: origins}
	w.code.Store(int32(websocket.StatusNormalClosure))
	return w
}

// upgrade reads the HTTP upgrade request and answers it through the
// library, which checks the handshake and the Origin.
func (w *wsConn) upgrade() error {
	w.once.Do(func() {
		lr := &io.LimitedReader{R: w.raw, N: maxUpgradeRequest}
		br := bufio.NewReaderSize(lr, 4<<10)
		req, err := http.ReadRequest(br)
		lr.N = math.MaxInt64
		if err != nil {
			w.upErr = fmt.Errorf("websocket upgrade: %w", err)
			return
		}
		rw := &upgradeWriter{raw: w.raw, br: br, h: http.Header{}}
		if req.Header.Get("Origin") != "" && !wsHostAllowed(req.Host, w.origins) {
			// A browser's page under a name rebound to this address sends
			// Host and Origin of that name, which agree: the library's
			// Origin check would pass it.
			http.Error(rw, "unknown host name; add it to --ws-allowed-origins", http.StatusMisdirectedRequest)
			w.upErr = fmt.Errorf("websocket upgrade: Host %q is not an IP literal, localhost or an allowed origin", clip(req.Host))
			return
		}
		ws, err := websocket.Accept(rw, req, &websocket.AcceptOptions{
			OriginPatterns:  w.origins,
			CompressionMode: websocket.CompressionDisabled,
		})
		if err != nil {
			w.upErr = err
			return
		}
		// The frame header bounds what is read (conn.go checks it
		// against max_frame); the library's own limit would cut first.
		ws.SetReadLimit(-1)
		w.ws = ws
	})
	return w.upErr
}

// wsHostAllowed reports whether a browser's upgrade request may name the
// listener hostport (its Host header): an IP literal, localhost, or a
// name matching one of patterns (Config.WSAllowedOrigins, path.Match, as
// the Origin check matches them), the health listener's rule against DNS
// rebinding. A request without an Origin is not a browser's, and is not
// asked: a rebinding page cannot send one without it.
func wsHostAllowed(hostport string, patterns []string) bool {
	host, safe := rebindSafeHost(hostport)
	if safe {
		return true
	}
	for _, p := range patterns {
		if ok, err := path.Match(strings.ToLower(strings.TrimSuffix(p, ".")), host); err == nil && ok {
			return true
		}
	}
	return false
}

// Read passes on the frames of the binary messages, one frame a message.
func (w *wsConn) Read(p []byte) (int, error) {
	if w.rerr != nil {
		return 0, w.rerr
	}
	n, err := w.read(p)
	// An error is sticky: bufio.Reader reports it once, and a read after
	// it would go on into the next message as though this one were whole.
	w.rerr = err
	return n, err
}

func (w *wsConn) read(p []byte) (int, error) {
	if err := w.upgrade(); err != nil {
		return 0, err
	}
	for {
		if w.msg == nil {
			typ, r, err := w.ws.Reader(context.Background())
			if err != nil {
				return 0, err
			}
			if typ != websocket.MessageBinary {
				w.code.Store(int32(websocket.StatusUnsupportedData))
				return 0, errWSText
			}
			w.msg, w.msgEOF, w.hdrN, w.left = r, false, 0, -1
		}
		if w.hdrN < len(w.hdr) {
			if w.msgEOF {
				return 0, w.split()
			}
			n, err := w.msg.Read(w.hdr[w.hdrN:])
			w.hdrN += n
			if err := w.readErr(err); err != nil {
				return 0, err
			}
			if w.hdrN == len(w.hdr) {
				w.left = int64(binary.BigEndian.Uint32(w.hdr[:]))
				return copy(p, w.hdr[:]), nil
			}
			continue
		}
		if w.left == 0 {
			// The frame is whole: the message must end with it.
			for !w.msgEOF {
				var one [1]byte
				n, err := w.msg.Read(one[:])
				if n != 0 {
					return 0, w.split()
				}
				if err := w.readErr(err); err != nil {
					return 0, err
				}
			}
			w.msg = nil
			continue
		}
		if w.msgEOF {
			return 0, w.split()
		}
		if int64(len(p)) > w.left {
			p = p[:w.left]
		}
		n, err := w.msg.Read(p)
		w.left -= int64(n)
		if err := w.readErr(err); err != nil {
			return 0, err
		}
		if n > 0 {
			return n, nil
		}
	}
}

// readErr records the end of the message (io.EOF, which may come with
// bytes) and returns any other error.
func (w *wsConn) readErr(err error) error {
	if err == io.EOF {
		w.msgEOF = true
		return nil
	}
	return err
}

func (w *wsConn) split() error {
	w.code.Store(int32(websocket.StatusPolicyViolation))
	return errWSSplit
}

// Write sends each whole frame of p as one binary message; the writer
// (writer.go) writes whole frames, several at a time.
func (w *wsConn) Write(p []byte) (int, error) {
	if err := w.upgrade(); err != nil {
		return 0, err
	}
	buf := p
	if len(w.pending) > 0 {
		w.pending = append(w.pending, p...)
		buf = w.pending
	}
	for len(buf) >= 4 {
		n := 4 + int(binary.BigEndian.Uint32(buf))
		if len(buf) < n {
			break
		}
		if err := w.ws.Write(context.Background(), websocket.MessageBinary, buf[:n]); err != nil {
			return 0, err
		}
		buf = buf[n:]
	}
	w.pending = append(w.pending[:0], buf...)
	return len(p), nil
}

// goingAway makes the close code StatusGoingAway: the server drains.
func (w *wsConn) goingAway() {
	w.code.CompareAndSwap(int32(websocket.StatusNormalClosure), int32(websocket.StatusGoingAway))
}

// CloseWrite sends the close frame, with the connection's code, and waits
// a moment for the peer's, as lingerClose waits for a TCP peer.
func (w *wsConn) CloseWrite() error {
	if w.upgrade() != nil {
		return nil
	}
	w.raw.SetDeadline(time.Now().Add(500 * time.Millisecond))
	return w.ws.Close(websocket.StatusCode(w.code.Load()), "")
}

// Close closes the connection. After a message that broke the mapping
// (a text message, not one frame) it first sends the close frame with the
// code saying so, within a short deadline; otherwise at once, as a TCP
// connection is cut.
func (w *wsConn) Close() error {
	if w.ws != nil {
		if code := websocket.StatusCode(w.code.Load()); code == websocket.StatusUnsupportedData || code == websocket.StatusPolicyViolation {
			w.raw.SetDeadline(time.Now().Add(100 * time.Millisecond))
			w.ws.Close(code, "")
		}
		w.ws.CloseNow()
	}
	return w.raw.Close()
}

func (w *wsConn) LocalAddr() net.Addr                { return w.raw.LocalAddr() }
func (w *wsConn) RemoteAddr() net.Addr               { return w.raw.RemoteAddr() }
func (w *wsConn) SetDeadline(t time.Time) error      { return w.raw.SetDeadline(t) }
func (w *wsConn) SetReadDeadline(t time.Time) error  { return w.raw.SetReadDeadline(t) }
func (w *wsConn) SetWriteDeadline(t time.Time) error { return w.raw.SetWriteDeadline(t) }

// upgradeWriter is the http.ResponseWriter of one upgrade request: it
// writes the response straight to the connection and hands the connection
// over to the library.
type upgradeWriter struct {
	raw         net.Conn
	br          *bufio.Reader
	h           http.Header
	wroteHeader bool
}

func (u *upgradeWriter) Header() http.Header { return u.h }

func (u *upgradeWriter) WriteHeader(code int) {
	if u.wroteHeader {
		return
	}
	u.wroteHeader = true
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	if code != http.StatusSwitchingProtocols {
		u.h.Set("Connection", "close")
	}
	u.h.Write(&b)
	b.WriteString("\r\n")
	io.WriteString(u.raw, b.String())
}

func (u *upgradeWriter) Write(p []byte) (int, error) {
	u.WriteHeader(http.StatusOK)
	return u.raw.Write(p)
}

func (u *upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	// The rest of the stream is the raw connection's: the request's
	// reader keeps what it read past the request (the library keeps it).
	return u.raw, bufio.NewReadWriter(u.br, bufio.NewWriter(u.raw)), nil
}
