package server_test

import (
	"net"
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// dialFrom connects from local address ip (any 127.0.0.0/8 address is
// loopback on Linux) and completes the handshake, so that a test can play
// two peer addresses.
func (h *harness) dialFrom(ip string) *client {
	h.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	nc, err := d.Dial("tcp", h.srv.Addr().String())
	if err != nil {
		h.t.Skipf("dial from %s: %v", ip, err)
	}
	c := newClient(h.t, nc)
	c.send(&wire.Hello{Versions: []uint64{1}, Auth: authOf(h.cfg.AuthToken)})
	w, ok := c.next().(*wire.Welcome)
	if !ok {
		h.t.Fatalf("hello from %s answered %#v, want welcome", ip, w)
	}
	c.Welcome = w
	return c
}

// deafConversation makes conversation conv with a member on deaf that
// never acknowledges and one on teller, and tells into it until a tell is
// refused or n committed. It returns the refusal (nil if none) and how
// many tells committed; an enroll's refusal is returned as well.
func deafConversation(t *testing.T, deaf, teller *client, conv uint64, n int) (*wire.Error, int) {
	t.Helper()
	for _, c := range []*client{deaf, teller} {
		switch a := c.call(&wire.Enroll{ID: c.id(), Conversation: conv, Token: token()}).(type) {
		case *wire.Enrolled:
			if c == teller {
				cr := cred{conv, a.Participant, a.Generation, a.Secret}
				for i := range n {
					switch a := teller.call(&wire.Tell{ID: teller.id(), Conversation: conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte("x")}).(type) {
					case *wire.Told:
					case *wire.Error:
						return a, i
					default:
						t.Fatalf("tell answered %#v", a)
					}
				}
			}
		case *wire.Error:
			return a, 0
		default:
			t.Fatalf("enroll answered %#v", a)
		}
	}
	return nil, n
}

// One address fills what it may of the server-wide backlog with
// conversations whose members never acknowledge (issue 18, item 1): it is
// refused at its share, and a stranger from another address still enrolls
// into a new conversation and tells. Without shares the first address
// takes the budget and its ceiling, and the stranger's enroll or tell in a
// conversation like the last one the first address was refused in is
// refused too.
func TestShare_OneAddressCannotStarveAStranger(t *testing.T) {
	const budget = 400
	h := start(t, server.Config{BacklogRecords: budget, LimitLoopback: true})
	deaf, teller := h.dialFrom("127.0.0.1"), h.dialFrom("127.0.0.1")
	var last *wire.Error
	conv := uint64(1)
	for ; conv < 1000; conv++ {
		e, told := deafConversation(t, deaf, teller, conv, 1000)
		if e != nil && e.Code != wire.CodeBacklogFull {
			t.Fatalf("conversation %d: refused %#v, want backlog_full", conv, e)
		}
		if e != nil && told == 0 {
			last = e // refused at the first record of a new conversation
			break
		}
	}
	if last == nil {
		t.Fatalf("one address made %d conversations of deaf members, never refused", conv)
	}
	if last.Limit == nil || *last.Limit >= budget {
		t.Errorf("the first address was refused %#v, want a limit of its share, below %d", last, budget)
	}

	sdeaf, steller := h.dialFrom("127.0.0.2"), h.dialFrom("127.0.0.2")
	if e, told := deafConversation(t, sdeaf, steller, 1_000_000, 1); e != nil || told != 1 {
		t.Fatalf("a stranger's enroll and tell in a new conversation: refused %#v after %d tells, want admitted", e, told)
	}
}
