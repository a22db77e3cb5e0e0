package cluster_test

import (
	"net"
	"sync"
	"testing"

	"github.com/participantd/participantd/wire"
)

// proxy stands between clients and one node, message by message, so that
// a test can lose the node's answers: once deaf, it forwards the requests
// but drops every message of the node after its welcome, as a network
// that fails one way would, and reports each dropped one on dropped.
type proxy struct {
	ln      net.Listener
	dropped chan wire.Message
	wg      sync.WaitGroup

	// mu guards the fields below.
	mu sync.Mutex
	// +checklocks:mu
	target string // the node's address; a connection accepted before it is set is closed
	// +checklocks:mu
	deaf bool
	// +checklocks:mu
	conns map[net.Conn]bool
}

// startProxy listens; connect it to its node with setTarget (the node
// advertises the proxy's address, known first).
func startProxy(t *testing.T) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, dropped: make(chan wire.Message, 1024), conns: make(map[net.Conn]bool)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) setTarget(addr string) {
	p.mu.Lock()
	p.target = addr
	p.mu.Unlock()
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// deafen makes the proxy drop every message of the node after its welcome,
// on the connections open and on later ones.
func (p *proxy) deafen() {
	p.mu.Lock()
	p.deaf = true
	p.mu.Unlock()
}

// cut closes every connection through the proxy.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

func (p *proxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = true
	}
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			down.Close()
			continue
		}
		p.track(down, up)
		p.wg.Add(2)
		go p.pipe(down, up, true)
		go p.pipe(up, down, false)
	}
}

// pipe forwards the messages read from src to dst: requests when
// requests is set, else the node's messages, which it drops once deaf.
func (p *proxy) pipe(src, dst net.Conn, requests bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	r, w := wire.NewConn(src, wire.ConnOptions{}), wire.NewConn(dst, wire.ConnOptions{})
	for first := true; ; first = false {
		var m wire.Message
		var err error
		if requests {
			m, err = r.ReadRequest()
		} else {
			m, err = r.ReadServerMessage()
		}
		if err != nil {
			return
		}
		p.mu.Lock()
		drop := p.deaf && !requests && !first
		p.mu.Unlock()
		if drop {
			select {
			case p.dropped <- m:
			default:
			}
			continue
		}
		if err := w.WriteMessage(m); err != nil {
			return
		}
	}
}
