package cluster_test

import (
	"os"
	"testing"

	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// shared is the embedded etcd member every test of the package uses, each
// under a prefix of its own.
var shared *etcdtest.Shared

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(m, "cluster-test", &shared))
}

func prefix() string { return shared.Prefix() }
