// Package wsframe carries the wire protocol over a WebSocket as
// docs/PROTOCOL.md says: each frame, length prefix included, is one binary
// message. A Conn is a net.Conn, so a wire.Conn runs over it as over TCP.
package wsframe

import (
	"context"
	"encoding/binary"
	"net"

	"github.com/coder/websocket"
)

// headerSize is the frame's length prefix: 4 bytes, big-endian.
const headerSize = 4

// Conn is a net.Conn over a WebSocket. Reads return the bytes of the binary
// messages received, in order: the stream of frames a TCP connection
// carries. Writes send each whole frame as one binary message and keep a
// partial frame until the rest of it is written.
type Conn struct {
	net.Conn
	pending []byte
}

// New returns ws as a Conn.
func New(ws *websocket.Conn) *Conn {
	return &Conn{Conn: websocket.NetConn(context.Background(), ws, websocket.MessageBinary)}
}

// Dial opens a WebSocket to url ("ws://host:port/", or "wss://…" with
// opts.HTTPClient's TLS settings) and returns it as a Conn. The read limit
// is lifted: the server bounds its frames (welcome's max_frame), and a
// wire.Conn checks them as it reads.
func Dial(ctx context.Context, url string, opts *websocket.DialOptions) (*Conn, error) {
	ws, _, err := websocket.Dial(ctx, url, opts)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(-1)
	return New(ws), nil
}

// Write sends the whole frames that p completes, one message each.
func (c *Conn) Write(p []byte) (int, error) {
	c.pending = append(c.pending, p...)
	sent := 0
	for len(c.pending)-sent >= headerSize {
		n := headerSize + int(binary.BigEndian.Uint32(c.pending[sent:]))
		if len(c.pending)-sent < n {
			break
		}
		if _, err := c.Conn.Write(c.pending[sent : sent+n]); err != nil {
			return 0, err
		}
		sent += n
	}
	c.pending = append(c.pending[:0], c.pending[sent:]...)
	return len(p), nil
}

// FlushPartial sends what is left of a partial frame (a bare header, half
// a frame) as one message, as no conforming client would: for tests of a
// server's refusals.
func (c *Conn) FlushPartial() error {
	if len(c.pending) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.pending)
	c.pending = c.pending[:0]
	return err
}
