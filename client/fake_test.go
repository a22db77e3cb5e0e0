package client_test

import (
	"bytes"
	"crypto/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/wire"
)

// action is what a fake server's hook decides for one request.
type action int

const (
	pass           action = iota // apply and answer
	dropBefore                   // close the connection without applying
	commitThenDrop               // apply, then close without answering
	commitInDoubt                // apply, then answer in_doubt
	backlogFull                  // answer backlog_full without applying
	refuse                       // answer fakeServer.refusal without applying
	swallow                      // apply, then never answer (the connection stays open)
	hang                         // neither apply nor answer (a paused node)
	commitHeld                   // apply, then answer once fakeServer.held is closed
)

// fakeServer is a small in-memory participantd for the client's tests: it
// implements the protocol's operations, replays and bindings faithfully
// enough, and lets a test script failures through hook.
type fakeServer struct {
	t           *testing.T
	ln          net.Listener
	more        []net.Listener // addNode's, guarded by mu
	wg          sync.WaitGroup
	incarnation uint64
	auth        string

	// mu guards everything below.
	mu       sync.Mutex
	ordinal  uint64
	conns    map[*fconn]bool
	convs    map[uint64]*fconv
	requests []wire.Message
	hook     func(fc *fconn, m wire.Message) action
	refusal  wire.Error // the answer of refuse, its ID set per request
	// held, closed by the test, releases the answers of commitHeld; the
	// test closes it before the server's cleanup.
	held chan struct{}
	// tokenWindow and tokenSkew are announced in the welcome of the
	// connections accepted after they are set.
	tokenWindow, tokenSkew *uint64
	// maxFrame and maxRecord, when set, are announced in the welcome of
	// the connections accepted after they are set, and maxRecord bounds a
	// tell's payload; else wire.DefaultMaxFrame and 16.
	maxFrame, maxRecord uint64
	// reoffer makes an attach offer its participant every record
	// addressed to it after its cursor, as the server does.
	reoffer bool
	// ends is when each connection ended.
	ends []time.Time
}

type fconn struct {
	wc   *wire.Conn
	n    uint64
	node int // the listener it came through: 0, or addNode's count
}

type fconv struct {
	members []*fmember
	seq     uint64
	enrolls map[wire.Token]*wire.Enrolled
	// records is every record committed with fanoutLocked, with the
	// members it is addressed to (those that had not left, but its
	// subject).
	records []frecord
}

type frecord struct {
	d  wire.Delivery // Recipient unset
	to map[uint64]bool
}

type fmember struct {
	gen     uint64
	secrets map[uint64]wire.Secret
	bound   *fconn
	boundBy uint64 // the generation the binding was created with
	retired bool
	cursor  uint64
	tokens  map[wire.Token]wire.Message // committed answers
	bodies  map[wire.Token][]byte       // tell payloads
	attachG map[wire.Token]uint64       // presented generation of attaches
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{t: t, ln: ln, incarnation: 7, conns: make(map[*fconn]bool), convs: make(map[uint64]*fconv)}
	s.wg.Add(1)
	go s.accept(ln, 0)
	t.Cleanup(s.close)
	return s
}

// addNode opens another listener onto the same data and returns its
// address: a second node of a cluster whose nodes all serve every
// conversation, unless a hook answers moved or refuses by fconn.node.
func (s *fakeServer) addNode() string {
	s.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.more = append(s.more, ln)
	node := len(s.more)
	s.mu.Unlock()
	s.wg.Add(1)
	go s.accept(ln, node)
	return ln.Addr().String()
}

func (s *fakeServer) addr() string { return s.ln.Addr().String() }

func (s *fakeServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, ln := range s.more {
		ln.Close()
	}
	s.mu.Unlock()
	s.dropAll()
	s.wg.Wait()
}

// setTokenWindow makes the welcome of later connections announce window
// and skew (milliseconds); nil and nil announce none.
func (s *fakeServer) setTokenWindow(window, skew *uint64) {
	s.mu.Lock()
	s.tokenWindow, s.tokenSkew = window, skew
	s.mu.Unlock()
}

func (s *fakeServer) setHook(h func(fc *fconn, m wire.Message) action) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

// dropAll closes every connection, as a network failure would.
func (s *fakeServer) dropAll() {
	s.mu.Lock()
	var cs []*fconn
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.wc.Close()
	}
}

// sayBye sends bye{shutdown} on every connection and closes them.
func (s *fakeServer) sayBye() { s.sayByeWith(wire.ByeShutdown) }

// sayByeWith sends bye{reason} on every connection and closes them.
func (s *fakeServer) sayByeWith(reason string) {
	s.mu.Lock()
	var cs []*fconn
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.wc.WriteMessage(&wire.ServerBye{Reason: reason})
		c.wc.Close()
	}
}

// limitsLocked returns the max_frame and max_record_bytes announced.
// s.mu is held.
func (s *fakeServer) limitsLocked() (maxFrame, maxRecord uint64) {
	maxFrame, maxRecord = wire.DefaultMaxFrame, 16
	if s.maxFrame != 0 {
		maxFrame = s.maxFrame
	}
	if s.maxRecord != 0 {
		maxRecord = s.maxRecord
	}
	return maxFrame, maxRecord
}

// pushMsg sends a push (a delivery, a compacted notice) to every
// connection.
func (s *fakeServer) pushMsg(m wire.Message) {
	s.mu.Lock()
	var cs []*fconn
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.wc.WriteMessage(m)
	}
}

func (s *fakeServer) seen() []wire.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]wire.Message(nil), s.requests...)
}

func (s *fakeServer) member(conv, p uint64) fmember {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.convs[conv].members[p]
}

// supersedeLocked attaches participant p as another client would, minting a new
// generation and ending its binding.
// s.mu is held (hooks run with it).
func (s *fakeServer) supersedeLocked(conv, p uint64) {
	m := s.convs[conv].members[p]
	m.gen++
	m.secrets[m.gen] = randSecret()
	m.bound = nil
}

// push sends a delivery to every connection.
func (s *fakeServer) push(d *wire.Delivery) {
	s.mu.Lock()
	var cs []*fconn
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.wc.WriteMessage(d)
	}
}

func (s *fakeServer) accept(ln net.Listener, node int) {
	defer s.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go s.serve(nc, node)
	}
}

func (s *fakeServer) serve(nc net.Conn, node int) {
	defer s.wg.Done()
	wc := wire.NewConn(nc, wire.ConnOptions{})
	defer wc.Close()
	m, err := wc.ReadRequest()
	if err != nil {
		return
	}
	h, ok := m.(*wire.Hello)
	if !ok {
		_ = wc.WriteMessage(&wire.Rejected{Reason: wire.ReasonHelloRequired})
		return
	}
	if s.auth != "" && (h.Auth == nil || *h.Auth != s.auth) {
		_ = wc.WriteMessage(&wire.Rejected{Reason: wire.ReasonAuthFailed, Detail: "wrong token"})
		return
	}
	s.mu.Lock()
	s.ordinal++
	fc := &fconn{wc: wc, n: s.ordinal, node: node}
	s.conns[fc] = true
	window, skew := s.tokenWindow, s.tokenSkew
	maxFrame, maxRecord := s.limitsLocked()
	s.mu.Unlock()
	defer s.lost(fc)
	if err := wc.WriteMessage(&wire.Welcome{Version: 1, Server: "fake", Incarnation: s.incarnation,
		Connection: fc.n, MaxFrame: maxFrame, MaxRecordBytes: maxRecord,
		TokenWindow: window, TokenSkew: skew}); err != nil {
		return
	}
	for {
		m, err := wc.ReadRequest()
		if err != nil {
			return
		}
		if _, ok := m.(*wire.Bye); ok {
			return
		}
		s.mu.Lock()
		s.requests = append(s.requests, m)
		act := pass
		if s.hook != nil {
			act = s.hook(fc, m)
		}
		if act == dropBefore {
			s.mu.Unlock()
			return
		}
		if act == hang {
			s.mu.Unlock()
			continue
		}
		if act == refuse {
			e := s.refusal
			s.mu.Unlock()
			e.ID, _ = wire.ID(m)
			if err := wc.WriteMessage(&e); err != nil {
				return
			}
			continue
		}
		if act == backlogFull {
			s.mu.Unlock()
			id, _ := wire.ID(m)
			limit := uint64(100)
			if err := wc.WriteMessage(&wire.Error{ID: id, Code: wire.CodeBacklogFull, Detail: "scripted", Limit: &limit}); err != nil {
				return
			}
			continue
		}
		ans, pushes := s.applyLocked(fc, m)
		held := s.held
		// The pushes are written under s.mu, so that each connection gets
		// its deliveries in seq order, as from the server: a record that
		// commits on another connection meanwhile is pushed after these.
		for _, p := range pushes {
			_ = p.to.wc.WriteMessage(p.d)
		}
		s.mu.Unlock()
		switch act {
		case commitThenDrop:
			return
		case commitInDoubt:
			id, _ := wire.ID(m)
			ans = &wire.Error{ID: id, Code: wire.CodeInDoubt, Detail: "scripted"}
		case swallow:
			continue
		case commitHeld:
			// Answered later, while this connection serves the next
			// requests: an answer overtaken by those of later requests.
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				<-held
				_ = wc.WriteMessage(ans)
			}()
			continue
		}
		if err := wc.WriteMessage(ans); err != nil {
			return
		}
	}
}

// lost ends fc's bindings, as the server does for a lost connection.
func (s *fakeServer) lost(fc *fconn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, fc)
	s.ends = append(s.ends, time.Now())
	for _, cv := range s.convs {
		for _, m := range cv.members {
			if m.bound == fc {
				m.bound = nil
				cv.seq++
			}
		}
	}
}

type push struct {
	to *fconn
	d  *wire.Delivery
}

func randSecret() wire.Secret {
	var s wire.Secret
	_, _ = rand.Read(s[:])
	return s
}

func werr(id uint64, code wire.Code, detail string) *wire.Error {
	return &wire.Error{ID: id, Code: code, Detail: detail}
}

func ptr[T any](v T) *T { return &v }

// applyLocked applies request m from fc and returns its answer and the
// deliveries it produces. s.mu is held.
func (s *fakeServer) applyLocked(fc *fconn, m wire.Message) (wire.Message, []push) {
	switch r := m.(type) {
	case *wire.Ping:
		return &wire.Pong{ID: r.ID}, nil
	case *wire.Enroll:
		cv := s.convs[r.Conversation]
		if cv == nil {
			cv = &fconv{enrolls: make(map[wire.Token]*wire.Enrolled)}
			s.convs[r.Conversation] = cv
		}
		if a, ok := cv.enrolls[r.Token]; ok {
			b := *a
			b.ID = r.ID
			p := cv.members[a.Participant]
			b.Replay = ptr(wire.ReplayUnbound)
			if p.bound != nil && p.boundBy == 1 {
				b.Replay = ptr(wire.ReplayBound)
			}
			return &b, nil
		}
		cv.seq++
		p := &fmember{gen: 1, secrets: map[uint64]wire.Secret{1: randSecret()}, bound: fc, boundBy: 1,
			tokens: map[wire.Token]wire.Message{}, bodies: map[wire.Token][]byte{}, attachG: map[wire.Token]uint64{}}
		cv.members = append(cv.members, p)
		a := &wire.Enrolled{ID: r.ID, Conversation: r.Conversation, Participant: uint64(len(cv.members) - 1),
			Generation: 1, Secret: p.secrets[1]}
		cv.enrolls[r.Token] = a
		return a, s.fanoutLocked(r.Conversation, cv, a.Participant, wire.KindJoined, nil)
	case *wire.Attach:
		cv := s.convs[r.Conversation]
		if cv == nil || r.Participant >= uint64(len(cv.members)) {
			return werr(r.ID, wire.CodeUnknownParticipant, ""), nil
		}
		p := cv.members[r.Participant]
		if old, ok := p.tokens[r.Token]; ok {
			a := *old.(*wire.Attached)
			if p.attachG[r.Token] != r.Generation || p.secrets[r.Generation] != r.Secret {
				return werr(r.ID, wire.CodeStaleAuthority, "replay with another credential"), nil
			}
			if p.gen > a.Generation {
				return &wire.Error{ID: r.ID, Code: wire.CodeReceiptExpired, Participant: &a.Participant,
					Generation: &p.gen, Reason: ptr(wire.ExpiredSuperseded)}, nil
			}
			a.ID = r.ID
			a.Replay = ptr(wire.ReplayUnbound)
			if p.bound != nil && p.boundBy == a.Generation {
				a.Replay = ptr(wire.ReplayBound)
			}
			return &a, nil
		}
		if p.retired {
			return werr(r.ID, wire.CodeRetired, ""), nil
		}
		if r.Generation != p.gen || p.secrets[r.Generation] != r.Secret {
			return werr(r.ID, wire.CodeStaleAuthority, "presented generation is not the current one"), nil
		}
		p.gen++
		p.secrets[p.gen] = randSecret()
		p.bound, p.boundBy = fc, p.gen
		cv.seq++
		a := &wire.Attached{ID: r.ID, Conversation: r.Conversation, Participant: r.Participant,
			Generation: p.gen, Secret: p.secrets[p.gen], Cursor: p.cursor}
		p.tokens[r.Token] = a
		p.attachG[r.Token] = r.Generation
		pushes := s.fanoutLocked(r.Conversation, cv, r.Participant, wire.KindAttached, nil)
		if s.reoffer {
			for _, rec := range cv.records {
				if rec.d.Seq > p.cursor && rec.to[r.Participant] {
					d := rec.d
					d.Recipient = r.Participant
					pushes = append(pushes, push{fc, &d})
				}
			}
		}
		return a, pushes
	case *wire.Tell:
		cv, p, e := s.boundLocked(fc, r.ID, r.Conversation, r.Participant, r.Generation, r.Token)
		if old, ok := p.tokenAnswer(r.Token); ok {
			if !bytes.Equal(p.bodies[r.Token], r.Payload) {
				return werr(r.ID, wire.CodeTokenConflict, ""), nil
			}
			a := *old.(*wire.Told)
			a.ID, a.Replay = r.ID, ptr(wire.ReplayCommitted)
			return &a, nil
		}
		if e != nil {
			return e, nil
		}
		if _, limit := s.limitsLocked(); uint64(len(r.Payload)) > limit {
			return &wire.Error{ID: r.ID, Code: wire.CodeTooLarge, Limit: ptr(limit)}, nil
		}
		cv.seq++
		a := &wire.Told{ID: r.ID, Conversation: r.Conversation, Seq: cv.seq}
		p.tokens[r.Token], p.bodies[r.Token] = a, r.Payload
		return a, s.fanoutLocked(r.Conversation, cv, r.Participant, wire.KindRecord, r.Payload)
	case *wire.Ack:
		_, p, e := s.boundLocked(fc, r.ID, r.Conversation, r.Participant, r.Generation, wire.Token{})
		if e != nil {
			return e, nil
		}
		if r.Through < p.cursor {
			return &wire.Error{ID: r.ID, Code: wire.CodeAckRegression, Cursor: &p.cursor}, nil
		}
		noop := r.Through == p.cursor
		p.cursor = r.Through
		return &wire.Acked{ID: r.ID, Conversation: r.Conversation, Participant: r.Participant, Cursor: p.cursor, Noop: noop}, nil
	case *wire.Detach:
		cv, p, e := s.boundLocked(fc, r.ID, r.Conversation, r.Participant, r.Generation, r.Token)
		if old, ok := p.tokenAnswer(r.Token); ok {
			a := *old.(*wire.Detached)
			a.ID, a.Replay = r.ID, ptr(wire.ReplayCommitted)
			return &a, nil
		}
		if e != nil {
			return e, nil
		}
		cv.seq++
		p.bound = nil
		a := &wire.Detached{ID: r.ID, Conversation: r.Conversation, Participant: r.Participant, Seq: cv.seq}
		p.tokens[r.Token] = a
		return a, nil
	case *wire.Leave:
		cv := s.convs[r.Conversation]
		if cv == nil || r.Participant >= uint64(len(cv.members)) {
			return werr(r.ID, wire.CodeUnknownParticipant, ""), nil
		}
		p := cv.members[r.Participant]
		if old, ok := p.tokens[r.Token]; ok {
			a := *old.(*wire.Left)
			a.ID, a.Replay = r.ID, ptr(wire.ReplayCommitted)
			return &a, nil
		}
		if p.retired {
			return werr(r.ID, wire.CodeRetired, ""), nil
		}
		if r.Generation != p.gen || p.secrets[r.Generation] != r.Secret {
			return werr(r.ID, wire.CodeStaleAuthority, ""), nil
		}
		cv.seq++
		p.retired, p.bound = true, nil
		a := &wire.Left{ID: r.ID, Conversation: r.Conversation, Participant: r.Participant, Seq: cv.seq}
		p.tokens[r.Token] = a
		return a, s.fanoutLocked(r.Conversation, cv, r.Participant, wire.KindLeft, nil)
	}
	s.t.Errorf("fake server: unexpected %T", m)
	return werr(0, wire.CodeBadRequest, ""), nil
}

func (p *fmember) tokenAnswer(t wire.Token) (wire.Message, bool) {
	if p == nil {
		return nil, false
	}
	a, ok := p.tokens[t]
	return a, ok
}

// boundLocked finds the participant of a request that needs the binding and
// checks, in the protocol's order, everything but the token.
func (s *fakeServer) boundLocked(fc *fconn, id, conv, part, gen uint64, _ wire.Token) (*fconv, *fmember, *wire.Error) {
	cv := s.convs[conv]
	if cv == nil || part >= uint64(len(cv.members)) {
		return nil, nil, werr(id, wire.CodeUnknownParticipant, "")
	}
	p := cv.members[part]
	switch {
	case p.retired:
		return cv, p, werr(id, wire.CodeRetired, "")
	case gen != p.gen:
		return cv, p, &wire.Error{ID: id, Code: wire.CodeStaleAuthority, Generation: &p.gen}
	case p.bound != fc:
		return cv, p, werr(id, wire.CodeNoBinding, "")
	}
	return cv, p, nil
}

// fanoutLocked makes the deliveries of a new record to every other bound
// member.
func (s *fakeServer) fanoutLocked(conv uint64, cv *fconv, subject uint64, kind wire.Kind, payload []byte) []push {
	var out []push
	rec := frecord{d: wire.Delivery{Conversation: conv, Seq: cv.seq, Kind: kind, Participant: subject}, to: make(map[uint64]bool)}
	if kind == wire.KindRecord {
		rec.d.Payload = payload
	}
	for i, m := range cv.members {
		if uint64(i) == subject || m.retired {
			continue
		}
		rec.to[uint64(i)] = true
		if m.bound == nil {
			continue
		}
		d := rec.d
		d.Recipient = uint64(i)
		out = append(out, push{m.bound, &d})
	}
	cv.records = append(cv.records, rec)
	return out
}

// setLimits makes the welcome of later connections announce maxFrame
// and maxRecord (zero: the default), and bounds tells by maxRecord.
func (s *fakeServer) setLimits(maxFrame, maxRecord uint64) {
	s.mu.Lock()
	s.maxFrame, s.maxRecord = maxFrame, maxRecord
	s.mu.Unlock()
}

// dropNode closes every connection that came through node's listener, as
// a network failure between the client and that node would.
func (s *fakeServer) dropNode(node int) {
	s.mu.Lock()
	var cs []*fconn
	for c := range s.conns {
		if c.node == node {
			cs = append(cs, c)
		}
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.wc.Close()
	}
}

// boundNode returns the node of the connection holding participant p of
// conv's binding, or -1 when it is not bound.
func (s *fakeServer) boundNode(conv, p uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.convs[conv].members[p]; m.bound != nil {
		return m.bound.node
	}
	return -1
}
