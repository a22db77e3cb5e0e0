// Package scripts holds the tests of the shell scripts beside it.
package scripts

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
	needClusterUp(t)
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
		// status asked of node3 follows the owner, with the shared admin token.
		if !strings.Contains(string(out), "owner:     node node1") || !strings.Contains(string(out), "PARTICIPANT  GENERATION") {
			t.Fatalf("run %d: the demo's status did not show the owner's answer:\n%s", run, out)
		}
	}
}

// needClusterUp skips t unless cluster-up can run here: curl on the PATH
// and the nodes' fixed ports (7431..7433, 7441..7443) free on loopback.
func needClusterUp(t *testing.T) {
	t.Helper()
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
}

// TestClusterUp_WhileRunning starts a cluster with cluster-up and runs
// cluster-up again on the same CLUSTER_DIR while it is up: the second run
// must say that a cluster runs from that directory and how to stop it,
// must not advise removing the directory, and must change none of the
// running cluster's files (binaries, etcd endpoints, pid list). Then
// `cluster-up --stop` must stop the first run, leaving the data.
func TestClusterUp_WhileRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd and 3 nodes")
	}
	needClusterUp(t)
	dir := t.TempDir()
	env := append(os.Environ(), "CLUSTER_DIR="+dir)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	first := exec.CommandContext(ctx, "./cluster-up")
	first.Env = env
	first.WaitDelay = 10 * time.Second
	stdout, err := first.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var firstErr strings.Builder
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop := exec.Command("./cluster-up", "--stop")
			stop.Env = env
			stop.Run()
			<-done
		}
	})
	sc := bufio.NewScanner(stdout)
	var firstOut strings.Builder
	up := false
	for sc.Scan() {
		firstOut.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "cluster up;") {
			up = true
			break
		}
	}
	go func() {
		io.Copy(io.Discard, stdout)
		done <- first.Wait()
	}()
	if !up {
		t.Fatalf("the first cluster-up did not come up:\n%s\n%s", firstOut.String(), firstErr.String())
	}

	before := snapshot(t, dir)
	again := exec.CommandContext(ctx, "./cluster-up")
	again.Env = env
	out, err := again.CombinedOutput()
	if err == nil {
		t.Fatalf("cluster-up while a cluster runs from the same directory succeeded:\n%s", out)
	}
	for _, want := range []string{"already running from " + dir, "pids ", "scripts/cluster-up --stop"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("second run's output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"remove", "rm -"} {
		if strings.Contains(strings.ToLower(string(out)), bad) {
			t.Errorf("second run's output advises %q while a cluster runs:\n%s", bad, out)
		}
	}
	if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
		t.Errorf("the second run changed the running cluster's files (-before +after):\n%s", diff)
	}

	stop := exec.CommandContext(ctx, "./cluster-up", "--stop")
	stop.Env = env
	if out, err := stop.CombinedOutput(); err != nil {
		t.Fatalf("cluster-up --stop: %v\n%s", err, out)
	} else if !strings.Contains(string(out), "stopped") {
		t.Errorf("cluster-up --stop says:\n%s", out)
	}
	<-done // the first run ended: its nodes and etcd are gone
	stopped = true
	if _, err := os.Stat(dir + "/cluster.pids"); !os.IsNotExist(err) {
		t.Errorf("cluster.pids left behind after --stop: %v", err)
	}
	if _, err := os.Stat(dir + "/node1"); err != nil {
		t.Errorf("--stop removed node1's data: %v", err)
	}
}

// snapshot is the size, modification time and, for small files, content
// of the files cluster-up itself writes in dir.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(dir + "/bin/*")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, dir+"/cluster.pids", dir+"/etcd-endpoints", dir+"/admin-token")
	m := map[string]string{}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			m[f] = err.Error()
			continue
		}
		m[f] = fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
		if fi.Size() < 4096 {
			b, _ := os.ReadFile(f)
			m[f] += " " + string(b)
		}
	}
	return m
}
