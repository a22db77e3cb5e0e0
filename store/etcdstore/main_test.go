package etcdstore_test

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

// shared is the one-member etcd every test of the package uses, each under
// a prefix of its own (see prefix): starting a member costs about a second.
var (
	shared    *etcdtest.Cluster
	sharedCli *clientv3.Client
	prefixes  atomic.Uint64
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdstore-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	shared, err = etcdtest.Start(dir, etcdtest.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sharedCli, err = clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		shared.Close()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	sharedCli.Close()
	shared.Close()
	if code == 0 {
		// etcd's own goroutines are gone once the member and the client
		// are closed; anything left is ours.
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return code
}

// prefix returns a key prefix no other test uses.
func prefix() string {
	return fmt.Sprintf("/test/%d/", prefixes.Add(1))
}
