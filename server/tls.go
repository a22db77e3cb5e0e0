package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// certs is a listener's TLS identity, reloadable while serving: a
// handshake takes the certificate current when it starts, so Reload
// changes what new connections see and leaves open ones alone.
type certs struct {
	certFile, keyFile string
	// clientCAs, when set, verify client certificates, which are then
	// required (mutual TLS).
	clientCAs *x509.CertPool
	cert      atomic.Pointer[tls.Certificate]
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
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("server: %s-client-ca: %w", name, err)
		}
		c.clientCAs = x509.NewCertPool()
		if !c.clientCAs.AppendCertsFromPEM(pem) {
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

// config is the server-side TLS configuration of c.
func (c *certs) config() *tls.Config {
	conf := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cert.Load(), nil
		},
	}
	if c.clientCAs != nil {
		conf.ClientCAs = c.clientCAs
		conf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return conf
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
