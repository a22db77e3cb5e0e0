package etcdstore_test

import (
	"os"
	"testing"

	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// shared is the one-member etcd every test of the package uses, each under
// a prefix of its own (see prefix).
var shared *etcdtest.Shared

func TestMain(m *testing.M) { os.Exit(etcdtest.RunMain(m, "etcdstore-test", &shared)) }

// prefix returns a key prefix no other test uses.
func prefix() string { return shared.Prefix() }
