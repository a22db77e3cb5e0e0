package wire

import (
	"net"
	"sync"
)

// ConnOptions configures a Conn. The zero value means the defaults.
type ConnOptions struct {
	// MaxReadFrame is the largest body the Conn accepts; <= 0 means
	// DefaultMaxFrame. A server sets it to its max_frame; a client sets it
	// to what it is prepared to receive.
	MaxReadFrame int
	// MaxWriteFrame is the largest body the Conn sends; <= 0 means
	// DefaultMaxFrame. A client sets it from welcome.max_frame.
	MaxWriteFrame int
}

// Conn pairs a Reader and a Writer over a net.Conn. Reads are for one
// goroutine at a time; writes are safe for concurrent use, each frame going
// out whole in one Write.
type Conn struct {
	nc net.Conn
	r  *Reader

	// wmu serializes frames on the wire; it is held across the Write so
	// that frames from different goroutines never interleave.
	wmu sync.Mutex
	w   *Writer
}

// NewConn returns a Conn over nc. The Conn reads nc through a buffer: once
// it is in use, read nc only through the Conn.
func NewConn(nc net.Conn, opts ConnOptions) *Conn {
	return &Conn{
		nc: nc,
		r:  NewReader(nc, opts.MaxReadFrame),
		w:  NewWriter(nc, opts.MaxWriteFrame),
	}
}

// NetConn returns the underlying connection, for deadlines and addresses.
func (c *Conn) NetConn() net.Conn { return c.nc }

// ReadFrame reads one frame; see Reader.ReadFrame for its errors and for
// the ownership of the body (valid until the next read).
func (c *Conn) ReadFrame() ([]byte, error) { return c.r.ReadFrame() }

// Buffered returns how many bytes were read ahead of the frames returned;
// see Reader.Buffered.
func (c *Conn) Buffered() int { return c.r.Buffered() }

// ReadRequest reads one frame and decodes it with DecodeRequest. It returns
// ReadFrame's errors, or DecodeRequest's *DecodeError; after a BadRequest
// error the next frame may be read, after any other error the connection
// must close. The message does not alias the Conn's buffers.
func (c *Conn) ReadRequest() (Message, error) {
	body, err := c.r.ReadFrame()
	if err != nil {
		return nil, err
	}
	return DecodeRequest(body)
}

// ReadServerMessage reads one frame and decodes it with
// DecodeServerMessage, with the errors of ReadRequest.
func (c *Conn) ReadServerMessage() (Message, error) {
	body, err := c.r.ReadFrame()
	if err != nil {
		return nil, err
	}
	return DecodeServerMessage(body)
}

// WriteMessage encodes m and writes it as one frame; see
// Writer.WriteMessage for its errors. Safe for concurrent use.
func (c *Conn) WriteMessage(m Message) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.WriteMessage(m)
}

// WriteFrame writes body as one frame; see Writer.WriteFrame. Safe for
// concurrent use.
func (c *Conn) WriteFrame(body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.WriteFrame(body)
}

// SetMaxWriteFrame changes the largest body the Conn sends, as a client
// does on reading welcome.max_frame. maxFrame <= 0 means DefaultMaxFrame.
func (c *Conn) SetMaxWriteFrame(maxFrame int) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.w.SetMaxFrame(maxFrame)
}

// Close closes the underlying connection, which also unblocks a pending
// read or write.
func (c *Conn) Close() error { return c.nc.Close() }
