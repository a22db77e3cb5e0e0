// Package scripts holds the tests of the shell scripts beside it.
package scripts

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestClusterUp_RunsTwice runs `cluster-up --demo` twice on one
// CLUSTER_DIR: the second run must restart the same etcd members on the
// ports their data names and serve the demo again, as the next step after
// a first look does. Loopback only; the nodes' fixed ports (7431..7433,
// 7441..7443) must be free.
func TestClusterUp_RunsTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd and 3 nodes twice")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("cluster-up needs curl")
	}
	for _, port := range []string{"7431", "7432", "7433", "7441", "7442", "7443"} {
		l, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Skipf("port %s is taken: %v", port, err)
		}
		l.Close()
	}
	dir := t.TempDir()
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		cmd := exec.CommandContext(ctx, "./cluster-up", "--demo")
		cmd.Env = append(os.Environ(), "CLUSTER_DIR="+dir)
		cmd.WaitDelay = 10 * time.Second
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			logs, _ := os.ReadFile(dir + "/etcd-dev.log")
			t.Fatalf("run %d: cluster-up --demo: %v\n%s\netcd-dev.log:\n%s", run, err, out, logs)
		}
		if !strings.Contains(string(out), "participantctl followed it to the owner") {
			t.Fatalf("run %d: the demo did not complete:\n%s", run, out)
		}
	}
}
