package server_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/wire"
)

// Issue 27 item 6: TLS 1.2 is served with ECDHE AEAD suites only; a
// client offering only CBC-SHA suites fails the handshake, on the wire
// listener and the health listener alike, and TLS 1.3 is unaffected.
func TestTLS_OnlyAEADSuitesUnderTLS12(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, HealthTLSCert: certFile, HealthTLSKey: keyFile})
	for _, addr := range []string{h.srv.Addr().String(), h.srv.HealthAddr().String()} {
		for _, tc := range []struct {
			name   string
			conf   func() *tls.Config
			wantOK bool
		}{
			{"1.2 CBC-SHA", suites(tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA), false},
			{"1.2 GCM", suites(tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256), true},
			{"1.2 ChaCha20", suites(tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256), true},
			{"1.3", func() *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS13} }, true},
		} {
			conf := tc.conf()
			conf.RootCAs, conf.ServerName = pool, "127.0.0.1"
			nc, err := tls.Dial("tcp", addr, conf)
			if (err == nil) != tc.wantOK {
				t.Errorf("%s to %s: %v, want ok %v", tc.name, addr, err, tc.wantOK)
			}
			if err == nil {
				nc.Close()
			}
		}
	}
}

// suites is a client configuration of TLS up to version offering ids.
func suites(version uint16, ids ...uint16) func() *tls.Config {
	return func() *tls.Config { return &tls.Config{MaxVersion: version, CipherSuites: ids} }
}

// Issue 27 item 6: under mutual TLS two CAs that issue the same name are
// two principals (each its own share), not one: the principal includes
// the issuer.
func TestShare_SameNameFromAnotherCAIsAnotherPrincipal(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	// Two self-signed client certificates: the same subject, each its own
	// CA with its own key.
	aCert, aKey, _ := servertest.SelfSignedAs(t, t.TempDir(), "client")
	bCert, bKey, _ := servertest.SelfSignedAs(t, t.TempDir(), "client")
	cas := clientCAs(t, aCert, bCert)
	// One percent of 100 conversations: each principal may hold one.
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, TLSClientCA: cas, MaxConversations: 100, ClientShare: 1})
	dialAs := func(cert, key string) *client {
		t.Helper()
		c, err := h.dialCert(&net.Dialer{}, pool, cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	enroll := func(c *client, conv uint64) *wire.Error { t.Helper(); return enrollRefusal(t, c, conv) }
	if e := enroll(dialAs(aCert, aKey), 1); e != nil {
		t.Fatalf("CA a's client's first conversation: %#v", e)
	}
	if e := enroll(dialAs(aCert, aKey), 2); e == nil || e.Code != wire.CodeCapacityExceeded {
		t.Errorf("CA a's client's second conversation: %#v, want capacity_exceeded (its share)", e)
	}
	if e := enroll(dialAs(bCert, bKey), 3); e != nil {
		t.Errorf("CA b's client of the same name: %#v, want admitted (another principal)", e)
	}
}

// dialCertFrom dials h's wire listener over TLS from local address ip,
// trusting pool and presenting the client certificate cert/key, and says
// hello if hello; the test is skipped if ip cannot be dialled from.
func (h *harness) dialCertFrom(ip string, pool *x509.CertPool, cert, key string, hello bool) *client {
	h.t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		h.t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	nc, err := tls.DialWithDialer(d, "tcp", h.srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{pair}})
	if err != nil {
		h.t.Skipf("dial from %s: %v", ip, err)
	}
	c := newClient(h.t, nc)
	if hello {
		c.send(&wire.Hello{Versions: []uint64{1}})
	}
	return c
}

// welcomed fails the test unless c's next message is a welcome.
func (c *client) welcomed(what string) {
	c.t.Helper()
	if m := c.next(); !isWelcome(m) {
		c.t.Fatalf("%s: hello answered %#v, want welcome", what, m)
	}
}

func isWelcome(m wire.Message) bool { _, ok := m.(*wire.Welcome); return ok }

// certsOf makes n self-signed client certificates named name0, name1, ...
// and returns their files.
func certsOf(t *testing.T, name string, n int) (certs, keys []string) {
	for i := range n {
		c, k, _ := servertest.SelfSignedAs(t, t.TempDir(), fmt.Sprintf("%s%d", name, i))
		certs, keys = append(certs, c), append(keys, k)
	}
	return certs, keys
}

// Issue 27, connections per mTLS principal: under mutual TLS the client
// certificate is the unit of the connection limits, whatever its address
// (loopback too, as for the shares): one certificate dialling from three
// addresses holds at most --max-connections-per-address connections, the
// third is rejected{overloaded}, and another certificate from the same
// address is welcomed. Counted per address, each address was under its
// limit (and loopback exempt), so the certificate held three.
func TestConnectionLimits_OneCertificateFromManyAddressesIsOnePrincipal(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	certs, keys := certsOf(t, "client ", 2)
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, TLSClientCA: clientCAs(t, certs...), MaxConnectionsPerAddress: 2})
	h.dialCertFrom("127.0.0.1", pool, certs[0], keys[0], true).welcomed("a's first connection")
	h.dialCertFrom("127.0.0.2", pool, certs[0], keys[0], true).welcomed("a's second connection")
	h.dialCertFrom("127.0.0.3", pool, certs[0], keys[0], true).expectRejected(wire.ReasonOverloaded)
	h.dialCertFrom("127.0.0.3", pool, certs[1], keys[1], true).welcomed("b's connection from the address a was refused at")
}

// Issue 27, connections per mTLS principal: above 80 % of
// --max-connections the certificate holding a twentieth is refused, not
// the address: three clients behind one NAT address, one connection
// each, are welcomed while the address holds more than a twentieth,
// and one of them is refused its third. A silent socket that has not
// said hello yet counts for its address (nobody has proven who it is):
// an address holding a twentieth of them is refused at the accept.
func TestConnectionLimits_CertificatesBehindOneAddressAreApart(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	certs, keys := certsOf(t, "client ", 5)
	// 80 % of 40 is 32; a twentieth 2.
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, TLSClientCA: clientCAs(t, certs...),
		LimitLoopback: true, MaxConnections: 40, MaxConnectionsPerAddress: 30, ConnectionRate: 1000})
	for range 30 {
		h.dialCertFrom("127.0.0.2", pool, certs[0], keys[0], true).welcomed("filler")
	}
	for range 2 {
		h.dialCertFrom("127.0.0.3", pool, certs[1], keys[1], true).welcomed("filler")
	}
	// The server holds 32: above 80 %.
	for i := 2; i < 5; i++ {
		h.dialCertFrom("127.0.0.1", pool, certs[i], keys[i], true).welcomed(fmt.Sprintf("client %d behind the NAT address", i))
	}
	h.dialCertFrom("127.0.0.1", pool, certs[2], keys[2], true).welcomed("client 2's second connection")
	h.dialCertFrom("127.0.0.1", pool, certs[2], keys[2], true).expectRejected(wire.ReasonOverloaded)
	h.dialCertFrom("127.0.0.4", pool, certs[0], keys[0], true).expectRejected(wire.ReasonOverloaded)

	h.dialCertFrom("127.0.0.5", pool, certs[3], keys[3], false)
	h.dialCertFrom("127.0.0.5", pool, certs[3], keys[3], false)
	h.dialCertFrom("127.0.0.5", pool, certs[3], keys[3], false).expectRejected(wire.ReasonOverloaded)
}

// Issue 27, connections per mTLS principal: under mutual TLS a client
// certificate has one conversation bucket, whatever its addresses
// (loopback too): with a burst of 2, one certificate dialling from two
// addresses creates two conversations, its third is rate_limited, and
// another certificate from the same address creates its own. Counted per
// address (loopback: per connection), each connection had a bucket of
// its own.
func TestConnectionLimits_OneCertificateHasOneConversationBucket(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	certs, keys := certsOf(t, "client ", 2)
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, TLSClientCA: clientCAs(t, certs...), ConversationRate: 0.001, ConversationBurst: 2})
	a1 := h.dialCertFrom("127.0.0.1", pool, certs[0], keys[0], true)
	a1.welcomed("a from 127.0.0.1")
	a2 := h.dialCertFrom("127.0.0.2", pool, certs[0], keys[0], true)
	a2.welcomed("a from 127.0.0.2")
	b := h.dialCertFrom("127.0.0.2", pool, certs[1], keys[1], true)
	b.welcomed("b from 127.0.0.2")
	a1.enroll(1)
	a2.enroll(2)
	expectCreationRefused(t, a1, 3, 2)
	expectCreationRefused(t, a2, 4, 2)
	b.enroll(5)
}
