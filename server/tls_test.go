package server_test

import (
	"crypto/tls"
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
