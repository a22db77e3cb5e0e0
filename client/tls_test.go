package client_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// TestDial_TLSMismatch_SaysTLS: a plaintext client of a server that
// serves TLS, and a TLS client of a plaintext server, are told that TLS
// is the likely cause, not only "EOF".
func TestDial_TLSMismatch_SaysTLS(t *testing.T) {
	ctx := testCtx(t)
	cert, key := selfSigned(t, t.TempDir())
	tlsSrv := servertest.Start(t, server.Config{DataDir: t.TempDir(), TLSCert: cert, TLSKey: key})
	_, err := client.Dial(ctx, tlsSrv.Addr().String(), client.Options{DialTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("plaintext Dial of a TLS server = %v, want an error that names TLS", err)
	}
	plain := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	_, err = client.Dial(ctx, plain.Addr().String(), client.Options{DialTimeout: 5 * time.Second,
		TLS: &tls.Config{InsecureSkipVerify: true}})
	if err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("TLS Dial of a plaintext server = %v, want an error that names TLS", err)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "participantd test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
