package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps_NoEtcdServer keeps the operator's CLI a client: it talks to
// etcd through the client library (cluster mode's offline tools), and
// never links an etcd server or raft, which the benchmark's --etcd-compare
// needs and which is why participantbench is a command of its own.
func TestDeps_NoEtcdServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, forbidden := range []string{"go.etcd.io/etcd/server/", "go.etcd.io/raft/", "go.etcd.io/etcd/pkg/"} {
			if strings.HasPrefix(pkg, forbidden) {
				t.Errorf("participantctl links %s (under %s): the etcd server belongs to participantbench, not the operator's CLI", pkg, forbidden)
			}
		}
	}
}
