package server

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
)

// aeadSuites are the TLS 1.2 cipher suites the listeners accept: ECDHE
// key exchange (forward secrecy) with an AEAD cipher. The CBC-SHA suites
// Go still enables for 1.2 (Lucky13-style padding oracles, no forward
// secrecy for the RSA key exchange ones) are left out; TLS 1.3's suites
// are all AEAD and not configurable.
var aeadSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// certIdentity is who a verified client certificate chain (leaf first)
// names: the leaf's first URI SAN (such as a SPIFFE id), else its
// subject, qualified by its issuer: the issuing certificate's subject and
// the SHA-256 of its public key. Two CAs that issue the same name are two
// principals, even under the same subject name; a CA renewed with its
// key keeps its principals.
func certIdentity(chain []*x509.Certificate) string {
	leaf := chain[0]
	id := leaf.Subject.String()
	if len(leaf.URIs) > 0 {
		id = leaf.URIs[0].String()
	}
	issuer := leaf // a certificate the pool holds itself
	if len(chain) > 1 {
		issuer = chain[1]
	}
	sum := sha256.Sum256(issuer.RawSubjectPublicKeyInfo)
	return fmt.Sprintf("%s issuer %q key %x", id, issuer.Subject.String(), sum[:8])
}

// certPrincipal returns the principal of nc's verified client
// certificate ("cert:" and its certIdentity), "" when nc is not TLS or
// presented none.
func certPrincipal(nc net.Conn) string {
	if tc := tlsOf(nc); tc != nil {
		if chains := tc.ConnectionState().VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
			return "cert:" + certIdentity(chains[0])
		}
	}
	return ""
}

// certs is a listener's TLS identity, reloadable while serving: a
// handshake takes the certificate current when it starts, so reload
// changes what new connections see and leaves open ones alone.
type certs struct {
	certFile, keyFile string
	cert              atomic.Pointer[tls.Certificate]
	// conf is the listener's one server configuration, serving cert: one
	// for every connection, so that they share its session ticket keys
	// and a client can resume a session on its next connection.
	conf *tls.Config
}

// loadTLS loads the key pair certFile/keyFile and, when clientCA is set,
// the CA file that client certificates must chain to. It returns nil, nil
// when certFile is empty. name prefixes the settings in errors ("tls",
// "health-tls").
func loadTLS(certFile, keyFile, clientCA, name string) (*certs, error) {
	if certFile == "" {
		if clientCA != "" {
			return nil, fmt.Errorf("server: %s-client-ca needs %s-cert and %s-key", name, name, name)
		}
		return nil, nil
	}
	c := &certs{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, fmt.Errorf("server: %s-cert/%s-key: %w", name, name, err)
	}
	c.conf = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: aeadSuites,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cert.Load(), nil
		},
	}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("server: %s-client-ca: %w", name, err)
		}
		// Client certificates are then required, and must chain to it
		// (mutual TLS).
		c.conf.ClientCAs = x509.NewCertPool()
		c.conf.ClientAuth = tls.RequireAndVerifyClientCert
		if !c.conf.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("server: %s-client-ca %s: no PEM certificate in it", name, clientCA)
		}
	}
	return c, nil
}

// reload reads the key pair again; on error the current one stays.
func (c *certs) reload() error {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return err
	}
	c.cert.Store(&cert)
	return nil
}

// ReloadTLS reads the certificates and keys of the wire and health
// listeners from their files again (participantd does it on SIGHUP), so
// that a renewed certificate is served without a restart. New connections
// get the new certificate, open ones keep theirs. On error the listener
// whose files failed keeps its current certificate; the error names it.
func (s *Server) ReloadTLS() error {
	var errs []error
	for _, l := range []struct {
		name string
		c    *certs
	}{{"tls", s.wireTLS}, {"health-tls", s.healthTLS}} {
		if l.c == nil {
			continue
		}
		if err := l.c.reload(); err != nil {
			errs = append(errs, fmt.Errorf("server: reload %s-cert/%s-key: %w", l.name, l.name, err))
		}
	}
	return errors.Join(errs...)
}
