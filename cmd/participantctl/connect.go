package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/internal/cli"
)

// defaultAddr is the server's default wire listener.
const defaultAddr = "127.0.0.1:7420"

// connFlags are the flags of every online subcommand.
type connFlags struct {
	addr          string
	authToken     string
	authTokenFile string
	envAuthToken  string // PARTICIPANTCTL_AUTH_TOKEN
	tlsCA         string
	tlsInsecure   bool
	timeout       time.Duration
	creds         string // resolved by credsFlag
	// addrFrom says where addr's default came from (PARTICIPANTCTL_ADDR,
	// or the built-in default), for a dial error to name; fs tells whether
	// --addr replaced it.
	addrFrom string
	fs       *pflag.FlagSet
}

func addConnFlags(fs *pflag.FlagSet, e *env) *connFlags {
	f := &connFlags{fs: fs, addrFrom: "PARTICIPANTCTL_ADDR"}
	addr := e.getenv("PARTICIPANTCTL_ADDR")
	if addr == "" {
		addr, f.addrFrom = defaultAddr, "the default address; set --addr or PARTICIPANTCTL_ADDR"
	}
	fs.StringVar(&f.addr, "addr", addr, "server address, or comma-separated addresses of cluster nodes; moved answers are followed (env PARTICIPANTCTL_ADDR)")
	f.envAuthToken = e.getenv("PARTICIPANTCTL_AUTH_TOKEN")
	fs.StringVar(&f.authToken, "auth-token", "", "the server's shared auth token; visible to other users in ps, prefer env PARTICIPANTCTL_AUTH_TOKEN or --auth-token-file")
	fs.StringVar(&f.authTokenFile, "auth-token-file", "", "read the server's shared auth token from this file (its first line)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "connect with TLS, trusting the CA certificates in this PEM file")
	fs.BoolVar(&f.tlsInsecure, "tls-insecure", false, "connect with TLS without verifying the server's certificate")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up on the connection and each operation after this long (0: never)")
	fs.Var(credsFlag{e: e, path: &f.creds}, "creds", "the credential file (JSON, rewritten atomically, mode 0600, after every attach); "+credsDirHelp)
	return f
}

// token returns the auth token to send: --auth-token-file, else
// --auth-token, else PARTICIPANTCTL_AUTH_TOKEN, else none.
func (f *connFlags) token() (string, error) {
	switch {
	case f.authTokenFile != "" && f.authToken != "":
		return "", &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("give --auth-token or --auth-token-file, not both")}
	case f.authTokenFile != "":
		b, err := os.ReadFile(f.authTokenFile)
		if err != nil {
			return "", fmt.Errorf("--auth-token-file: %w", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		if line = strings.TrimSpace(line); line == "" {
			return "", fmt.Errorf("--auth-token-file: %s holds no token", f.authTokenFile)
		}
		return line, nil
	case f.authToken != "":
		return f.authToken, nil
	}
	return f.envAuthToken, nil
}

func (f *connFlags) tlsConfig() (*tls.Config, error) {
	if f.tlsCA == "" && !f.tlsInsecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.tlsInsecure}
	if f.tlsCA != "" {
		pool, err := readCAs("tls-ca", f.tlsCA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// readCAs reads the PEM file of CAs given by the flag name; its errors
// name the flag.
func readCAs(name, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", name, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--%s: no certificate in %s", name, file)
	}
	return pool, nil
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
// that minted it returns. An operation that waits for its conversation's
// owner (a failover) says so on standard error. mods adjust the client's
// options, after the credential saver is set (a mod may wrap
// OnCredential).
func (f *connFlags) dial(ctx context.Context, e *env, discard bool, mods ...func(*client.ClusterOptions)) (*session, error) {
	tc, err := f.tlsConfig()
	if err != nil {
		return nil, err
	}
	tok, err := f.token()
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
	opts := client.ClusterOptions{Options: client.Options{
		AuthToken:         tok,
		TLS:               tc,
		ClientName:        "participantctl",
		DiscardDeliveries: discard,
		// The token of an enroll or attach is durable in the credential
		// file before the request goes out (see creds.go).
		OnIntent: func(in client.Intent) error { return writeIntent(s.creds, in) },
		OnCredential: func(cred client.Credential) {
			if err := writeCreds(s.creds, cred); err != nil {
				fmt.Fprintf(e.stderr, "participantctl: %v\n", err)
				s.mu.Lock()
				s.saveErr = errors.Join(s.saveErr, err)
				s.mu.Unlock()
			}
		},
	}}
	opts.OnWait = func(conv uint64, why error) {
		if s.Cluster != nil && s.Cluster.SingleServer() {
			fmt.Fprintf(e.stderr, "participantctl: waiting for the server at %s (%v)\n", f.addr, why)
			return
		}
		fmt.Fprintf(e.stderr, "participantctl: waiting for the owner of conversation %d (%v)\n", conv, why)
	}
	for _, mod := range mods {
		mod(&opts)
	}
	c, err := client.DialCluster(ctx, seeds, opts)
	if err != nil {
		if !fsHasFlag(f.fs, "addr") {
			return nil, fmt.Errorf("%w (address %s from %s)", err, f.addr, f.addrFrom)
		}
		return nil, err
	}
	s.Cluster = c
	return s, nil
}

// finish ends cred's binding with a detach, which the server answers once
// the ending is durable, so that whatever runs next sees the binding ended
// (the bye Close sends ends it too, but possibly after this process has
// exited, so a command run right after could see the ending come later).
// It is best effort and bounded: a failure leaves the ending to the bye.
func (s *session) finish(cred client.Credential) {
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	_, _ = s.Detach(ctx, cred)
}

// finishTimeout bounds finish.
const finishTimeout = 5 * time.Second

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
// for the subcommands that need the binding. An attach left pending in the
// file by an earlier run is retried first, with its token (see creds.go).
func (f *connFlags) attached(ctx context.Context, e *env, discard bool, mods ...func(*client.ClusterOptions)) (*session, client.Credential, error) {
	cred, err := readCreds(f.creds)
	if err != nil {
		return nil, cred, err
	}
	octx, cancel := f.opContext(ctx)
	defer cancel()
	s, err := f.dial(octx, e, discard, mods...)
	if err != nil {
		return nil, cred, err
	}
	cred, err = s.attachSaved(octx, cred)
	if err != nil {
		s.Close()
		return nil, cred, fmt.Errorf("attach: %w", explain(err, about{cred: cred, creds: f.creds}))
	}
	return s, cred, nil
}
