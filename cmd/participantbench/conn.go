package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/wire"
	"github.com/participantd/participantd/wire/wsframe"
)

// benchConn is the bench's own minimal client: one wire.Conn, requests
// pipelined by id, answers dispatched to callbacks by the one reader
// goroutine. It has no retries and no reconnects: the bench counts only
// answers the server actually gave.
//
// Requests sent from the reader goroutine (by a callback, see sendLater)
// are queued and written together just before the reader would wait for
// the socket: what the answers of one read make the client send (the next
// tell, an ack) leaves in one write, as a client that pipelines over one
// connection does, instead of one write and one goroutine hand-off each.
type benchConn struct {
	wc      *wire.Conn
	welcome *wire.Welcome
	nextID  atomic.Uint64

	// wmu guards out and orders every frame this conn writes.
	wmu sync.Mutex
	// out holds the frames queued by sendLater, not yet written.
	out []byte

	// mu guards calls.
	mu    sync.Mutex
	calls map[uint64]func(wire.Message)

	// onDelivery, if set before start, is called by the reader for every
	// delivery push.
	onDelivery func(*wire.Delivery)

	readErr  error // set by the reader before done closes
	readDone chan struct{}
}

// dialBench connects to addr (HOST:PORT over TCP, or a ws:// URL over a
// WebSocket), says hello and reads welcome. The reader is not started:
// call start once onDelivery is set.
func dialBench(ctx context.Context, addr string) (*benchConn, error) {
	var nc net.Conn
	var err error
	if strings.HasPrefix(addr, "ws://") {
		nc, err = wsframe.Dial(ctx, addr, nil)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	wc := wire.NewConn(nc, wire.ConnOptions{})
	name := "participantbench"
	if err := wc.WriteMessage(&wire.Hello{Versions: []uint64{wire.Version}, Client: &name}); err != nil {
		wc.Close()
		return nil, fmt.Errorf("hello: %w", err)
	}
	m, err := wc.ReadServerMessage()
	if err != nil {
		wc.Close()
		return nil, fmt.Errorf("reading welcome: %w", err)
	}
	w, ok := m.(*wire.Welcome)
	if !ok {
		wc.Close()
		return nil, fmt.Errorf("handshake: got %s, want welcome (%+v)", m.Type(), m)
	}
	wc.SetMaxWriteFrame(int(w.MaxFrame))
	return &benchConn{wc: wc, welcome: w, calls: make(map[uint64]func(wire.Message)), readDone: make(chan struct{})}, nil
}

func (c *benchConn) start() { go c.read() }

func (c *benchConn) read() {
	defer close(c.readDone)
	for {
		if c.wc.Buffered() == 0 {
			// About to wait for the socket: what the frames read so far
			// made the callbacks send goes out first, in one write.
			if err := c.flush(); err != nil {
				c.wc.Close() // the read below fails and ends the calls
			}
		}
		m, err := c.wc.ReadServerMessage()
		if err != nil {
			c.readErr = err
			c.mu.Lock()
			calls := c.calls
			c.calls = nil
			c.mu.Unlock()
			for _, f := range calls {
				f(nil)
			}
			return
		}
		if d, ok := m.(*wire.Delivery); ok {
			if c.onDelivery != nil {
				c.onDelivery(d)
			}
			continue
		}
		id, ok := wire.ID(m)
		if !ok {
			continue // a server bye; the read error follows
		}
		c.mu.Lock()
		f := c.calls[id]
		delete(c.calls, id)
		c.mu.Unlock()
		if f != nil {
			f(m)
		}
	}
}

// errConnClosed is what a callback gets (as a nil message) when the
// connection ended before its answer.
var errConnClosed = errors.New("bench: connection ended before the answer")

// send assigns req an id, registers done for its answer and writes it
// (after any frame sendLater queued). done runs on the reader goroutine,
// with nil if the connection ended first.
func (c *benchConn) send(req wire.Message, done func(wire.Message)) error {
	return c.enqueue(req, done, false)
}

// sendLater is send for the reader goroutine (a callback): req is queued
// and written with whatever else the reader's callbacks queue before it
// next waits for the socket. A write error then closes the connection,
// which fails every call in flight (done gets nil).
func (c *benchConn) sendLater(req wire.Message, done func(wire.Message)) error {
	return c.enqueue(req, done, true)
}

// write writes m at once, after any frame sendLater queued.
func (c *benchConn) write(m wire.Message) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.out = wire.AppendFrame(c.out, m)
	return c.flushLocked()
}

// flush writes the frames sendLater queued.
func (c *benchConn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.flushLocked()
}

func (c *benchConn) flushLocked() error {
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.wc.NetConn().Write(c.out)
	c.out = c.out[:0]
	return err
}

func (c *benchConn) enqueue(req wire.Message, done func(wire.Message), later bool) error {
	id := c.nextID.Add(1)
	setRequestID(req, id)
	c.mu.Lock()
	if c.calls == nil {
		c.mu.Unlock()
		return errConnClosed
	}
	c.calls[id] = done
	c.mu.Unlock()
	c.wmu.Lock()
	n := len(c.out)
	c.out = wire.AppendFrame(c.out, req)
	var err error
	if body := len(c.out) - n - wire.HeaderLen; c.welcome.MaxFrame > 0 && uint64(body) > c.welcome.MaxFrame {
		c.out = c.out[:n]
		err = &wire.FrameTooLargeError{Length: uint64(body), Max: c.welcome.MaxFrame}
	} else if !later {
		err = c.flushLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		c.mu.Lock()
		_, mine := c.calls[id]
		delete(c.calls, id)
		c.mu.Unlock()
		if mine {
			return err
		}
		return nil // the reader already failed it
	}
	return nil
}

// call sends req and waits for its answer.
func (c *benchConn) call(ctx context.Context, req wire.Message) (wire.Message, error) {
	ch := make(chan wire.Message, 1)
	if err := c.send(req, func(m wire.Message) { ch <- m }); err != nil {
		return nil, err
	}
	select {
	case m := <-ch:
		if m == nil {
			return nil, errConnClosed
		}
		if e, ok := m.(*wire.Error); ok {
			return nil, e
		}
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("bench: no answer to %s in 30s", req.Type())
	}
}

func (c *benchConn) close() {
	c.wc.Close()
	<-c.readDone
}

// setRequestID sets the id of the requests the bench sends.
func setRequestID(m wire.Message, id uint64) {
	switch r := m.(type) {
	case *wire.Enroll:
		r.ID = id
	case *wire.Attach:
		r.ID = id
	case *wire.Tell:
		r.ID = id
	case *wire.Ack:
		r.ID = id
	case *wire.Detach:
		r.ID = id
	case *wire.Leave:
		r.ID = id
	case *wire.Ping:
		r.ID = id
	case *wire.Bye:
		r.ID = id
	default:
		panic(fmt.Sprintf("bench: %s is not a request", m.Type()))
	}
}
