package cluster_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// One embedded etcd member serves every test of the package, each under a
// prefix of its own.
var (
	shared    *etcdtest.Cluster
	sharedCli *clientv3.Client
	prefixes  atomic.Uint64
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "cluster-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if shared, err = etcdtest.Start(dir, etcdtest.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer shared.Close()
	sharedCli, err = clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	sharedCli.Close()
	shared.Close()
	if code == 0 {
		// Members of an in-process multi-member etcd leave their peer
		// HTTP connections to each other idle after Close; those are
		// etcd's, not ours.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).abortPendingRead"),
		); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

func prefix() string { return fmt.Sprintf("/test/%d/", prefixes.Add(1)) }
