package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/participantd/participantd/client"
)

// defaultAddr is the server's default wire listener.
const defaultAddr = "127.0.0.1:7420"

// connFlags are the flags of every online subcommand.
type connFlags struct {
	addr        string
	authToken   string
	tlsCA       string
	tlsInsecure bool
	timeout     time.Duration
	creds       string
}

func addConnFlags(fs *flag.FlagSet, e *env) *connFlags {
	f := &connFlags{}
	addr := e.getenv("PARTICIPANTCTL_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	fs.StringVar(&f.addr, "addr", addr, "server address, or comma-separated addresses of cluster nodes; moved answers are followed (env PARTICIPANTCTL_ADDR)")
	fs.StringVar(&f.authToken, "auth-token", "", "the server's shared auth token")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "connect with TLS, trusting the CA certificates in this PEM file")
	fs.BoolVar(&f.tlsInsecure, "tls-insecure", false, "connect with TLS without verifying the server's certificate")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up on the connection and each operation after this long (0: never)")
	fs.StringVar(&f.creds, "creds", "", "the credential file (JSON, rewritten atomically, mode 0600, after every attach)")
	return f
}

func (f *connFlags) tlsConfig() (*tls.Config, error) {
	if f.tlsCA == "" && !f.tlsInsecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.tlsInsecure}
	if f.tlsCA != "" {
		pem, err := os.ReadFile(f.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca: no certificate in %s", f.tlsCA)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// session is one connection of an online subcommand, saving every new
// credential of its participant to the credential file.
type session struct {
	*client.Cluster
	creds string

	// mu guards saveErr.
	mu      sync.Mutex
	saveErr error
}

// dial connects. Every credential the client mints (enroll, attach, the
// re-attachments after a reconnect) is written to f.creds before the call
// that minted it returns.
func (f *connFlags) dial(ctx context.Context, e *env, discard bool) (*session, error) {
	tc, err := f.tlsConfig()
	if err != nil {
		return nil, err
	}
	s := &session{creds: f.creds}
	var seeds []string
	for _, a := range strings.Split(f.addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			seeds = append(seeds, a)
		}
	}
	c, err := client.DialCluster(ctx, seeds, client.ClusterOptions{Options: client.Options{
		AuthToken:         f.authToken,
		TLS:               tc,
		ClientName:        "participantctl",
		DiscardDeliveries: discard,
		OnCredential: func(cred client.Credential) {
			if err := writeCreds(s.creds, cred); err != nil {
				fmt.Fprintf(e.stderr, "participantctl: %v\n", err)
				s.mu.Lock()
				s.saveErr = errors.Join(s.saveErr, err)
				s.mu.Unlock()
			}
		},
	}})
	if err != nil {
		return nil, err
	}
	s.Cluster = c
	return s, nil
}

// saved returns the first failure to save a credential, if any: the
// credential file then holds one the server no longer accepts.
func (s *session) saved() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.saveErr != nil {
		return fmt.Errorf("the credential file %s is stale: %w", s.creds, s.saveErr)
	}
	return nil
}

// opContext bounds one operation by --timeout.
func (f *connFlags) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, f.timeout)
}

// attached dials and attaches the participant of the credential file,
// for the subcommands that need the binding.
func (f *connFlags) attached(ctx context.Context, e *env, discard bool) (*session, client.Credential, error) {
	cred, err := readCreds(f.creds)
	if err != nil {
		return nil, cred, err
	}
	octx, cancel := f.opContext(ctx)
	defer cancel()
	s, err := f.dial(octx, e, discard)
	if err != nil {
		return nil, cred, err
	}
	cred, err = s.Attach(octx, cred)
	if err == nil {
		err = s.saved()
	}
	if err != nil {
		s.Close()
		return nil, cred, fmt.Errorf("attach: %w", err)
	}
	return s, cred, nil
}
