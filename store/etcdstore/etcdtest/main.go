package etcdtest

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// Shared is the one-member etcd every test of a test binary uses, each
// under a key prefix of its own (Prefix): starting a member costs about a
// second.
type Shared struct {
	*Cluster
	// Client is connected to the member for the whole run.
	Client   *clientv3.Client
	prefixes atomic.Uint64
}

// Prefix returns a key prefix no other test of the binary uses.
func (s *Shared) Prefix() string { return fmt.Sprintf("/test/%d/", s.prefixes.Add(1)) }

// RunMain is a TestMain's body: it starts a one-member etcd in a temporary
// directory named after name, sets *shared, runs the tests, closes the
// member and the client, and then, if the tests passed, fails the run when
// a goroutine started during it is still running (goleak), besides those
// matching ignore and the idle peer HTTP connections that the members of an
// in-process multi-member etcd leave to each other after Close (etcd's, not
// the tests'). It returns the exit code for os.Exit.
func RunMain(m *testing.M, name string, shared **Shared, ignore ...goleak.Option) int {
	before := goleak.IgnoreCurrent()
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	c, err := Start(dir, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.Close()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*shared = &Shared{Cluster: c, Client: cli}
	code := m.Run()
	cli.Close()
	c.Close()
	if code == 0 {
		opts := append([]goleak.Option{before,
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		}, ignore...)
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

// LaggingClient returns a new client of the shared member whose KV reads
// through a lagging member (Lag, seeded with seed): everything built on the
// client (a cluster node's claims, its store) meets it. The caller closes
// the client.
func (s *Shared) LaggingClient(seed uint64) (*clientv3.Client, *Lagging, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, err
	}
	lag := Lag(cli.KV, seed)
	cli.KV = lag
	return cli, lag, nil
}
