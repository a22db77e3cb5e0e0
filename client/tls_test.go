package client_test

import (
	"crypto/tls"
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
	cert, key, _ := servertest.SelfSigned(t, t.TempDir())
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
