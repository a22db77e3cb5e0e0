package server_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
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

// TestShare_ClientCertificateIsThePrincipal (security, left open last
// round: n addresses got n shares, and mutual TLS identities were no
// principal): under mutual TLS a connection acts for its certificate's
// identity, whatever its address, loopback included. With a share of one
// conversation, a client's second conversation is refused from any of its
// connections and addresses, while another certificate's is admitted.
func TestShare_ClientCertificateIsThePrincipal(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	aCert, aKey, _ := servertest.SelfSignedAs(t, t.TempDir(), "client a")
	bCert, bKey, _ := servertest.SelfSignedAs(t, t.TempDir(), "client b")
	cas := clientCAs(t, aCert, bCert)
	// One percent of 100 conversations: each principal may hold one.
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, TLSClientCA: cas, MaxConversations: 100, ClientShare: 1})
	dialAs := func(ip, cert, key string) *client {
		t.Helper()
		c, err := h.dialCert(&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}, pool, cert, key)
		if err != nil {
			t.Skipf("dial from %s: %v", ip, err)
		}
		return c
	}
	enroll := func(c *client, conv uint64) *wire.Error { t.Helper(); return enrollRefusal(t, c, conv) }
	if e := enroll(dialAs("127.0.0.1", aCert, aKey), 1); e != nil {
		t.Fatalf("client a's first conversation: %#v", e)
	}
	for _, ip := range []string{"127.0.0.1", "127.0.0.3"} {
		if e := enroll(dialAs(ip, aCert, aKey), 2); e == nil || e.Code != wire.CodeCapacityExceeded {
			t.Errorf("client a's second conversation, from %s: %#v, want capacity_exceeded (its share)", ip, e)
		}
	}
	if e := enroll(dialAs("127.0.0.1", bCert, bKey), 3); e != nil {
		t.Errorf("client b's first conversation, from the same address: %#v, want admitted", e)
	}
}

// clientCAs writes the certificates of certFiles to one PEM bundle, a
// TLSClientCA file, and returns its path.
func clientCAs(t *testing.T, certFiles ...string) string {
	t.Helper()
	var pems []byte
	for _, f := range certFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pems = append(pems, b...)
	}
	cas := filepath.Join(t.TempDir(), "clients.pem")
	if err := os.WriteFile(cas, pems, 0o600); err != nil {
		t.Fatal(err)
	}
	return cas
}

// dialCert dials h's wire listener over TLS with d, trusting pool and
// presenting the client certificate of cert and key, and says hello. The
// error is the dial's.
func (h *harness) dialCert(d *net.Dialer, pool *x509.CertPool, cert, key string) (*client, error) {
	h.t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		h.t.Fatal(err)
	}
	nc, err := tls.DialWithDialer(d, "tcp", h.srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{pair}})
	if err != nil {
		return nil, err
	}
	c := newClient(h.t, nc)
	c.send(&wire.Hello{Versions: []uint64{1}})
	if m, ok := c.next().(*wire.Welcome); !ok {
		h.t.Fatalf("hello answered %#v", m)
	}
	return c, nil
}

// enrollRefusal enrolls c into conv and returns the error it is answered,
// nil when it is enrolled.
func enrollRefusal(t *testing.T, c *client, conv uint64) *wire.Error {
	t.Helper()
	switch a := c.call(&wire.Enroll{ID: c.id(), Conversation: conv, Token: token()}).(type) {
	case *wire.Enrolled:
		return nil
	case *wire.Error:
		return a
	default:
		t.Fatalf("enroll answered %#v", a)
		return nil
	}
}

// Issue 27, the many-address case: one host with fourteen addresses fills
// the server-wide backlog with conversations of deaf members, one share
// per address. Under a prefix that takes in its addresses (IPv4Prefix 24,
// as IPv6Prefix 56 or 48 takes in a site's /64s) the host is one
// principal with one share, and a newcomer from another prefix still
// tells. Under the default prefix (each address a peer) the newcomer is
// refused before its twentieth tell.
func TestShare_APrefixIsOnePrincipal(t *testing.T) {
	for _, tc := range []struct {
		prefix   int
		admitted bool
	}{{32, false}, {24, true}} {
		t.Run(fmt.Sprintf("/%d", tc.prefix), func(t *testing.T) {
			h := start(t, server.Config{BacklogRecords: 400, LimitLoopback: true, IPv4Prefix: tc.prefix})
			conv := uint64(1)
			for i := range 14 {
				ip := fmt.Sprintf("127.0.0.%d", 1+i)
				deaf, teller := h.dialFrom(ip), h.dialFrom(ip)
				for ; ; conv++ {
					if e, told := deafConversation(t, deaf, teller, conv, 1000); e != nil && told == 0 {
						break
					}
				}
				conv++
			}
			deaf, teller := h.dialFrom("127.0.1.1"), h.dialFrom("127.0.1.1")
			e, told := deafConversation(t, deaf, teller, 1_000_000, 20)
			if admitted := e == nil && told == 20; admitted != tc.admitted {
				t.Errorf("a newcomer's 20 tells: refused %#v after %d; admitted %v, want %v", e, told, admitted, tc.admitted)
			}
		})
	}
}

// dialRawFrom connects from local address ip without a hello.
func (h *harness) dialRawFrom(ip string) *client {
	h.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	nc, err := d.Dial("tcp", h.srv.Addr().String())
	if err != nil {
		h.t.Skipf("dial from %s: %v", ip, err)
	}
	return newClient(h.t, nc)
}
