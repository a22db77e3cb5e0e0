package robustness_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/internal/daemontest"
)

// rollingSteps is the cluster's rolling restart as docs/operations.md
// ("Upgrading", "Cluster (rolling restart)") lists it, word for word:
// TestRollingRestart carries out each step on real processes, and
// TestRollingRestart_DocsListTheSteps fails when the docs list other
// steps, so that neither changes without the other.
var rollingSteps = []string{
	"Take a cluster backup through any node and check it: " +
		"`PARTICIPANTCTL_ADMIN_TOKEN=\"$TOKEN\" participantctl backup --health node1:7441 --out before.backup`, " +
		"then `participantctl verify --from before.backup`.",
	"Check that every node is ready: `participantd --healthcheck --health-listen NODE:7441` exits 0 for each. " +
		"Never stop a node while another one is down or not ready.",
	"Stop one node with SIGTERM (`systemctl stop participantd`) and wait until its process has exited, with status 0. " +
		"It drains: it answers the requests it holds, ends its bindings with `bye` (`shutdown`) and releases its " +
		"conversations, which the other nodes claim at their next request; clients follow `moved` and attach their " +
		"participants there again.",
	"Install the new binaries on that node.",
	"Start it and wait until `participantd --healthcheck --health-listen NODE:7441` exits 0.",
	"Go back to step 2 for the next node, until every node runs the new binaries.",
}

// The two invariants of a rolling restart beyond those of every run.
const (
	InvCleanStop  = "sigterm-exits-cleanly"         // a node stopped with SIGTERM drains and exits 0
	InvRollingRun = "rolling-restart-keeps-serving" // every writer has a tell answered after each node's restart
	InvRollingAll = "rolling-restart-answers-all"   // no call fails for a rolling restart: every attempt is answered
)

// progressWait bounds how long, after a node is ready again, every writer
// may take to have a tell answered: a failover of the conversations it
// held (released, so claimed at once) and a client's backoff, with room
// for a loaded machine.
const progressWait = 30 * time.Second

// TestRollingRestart restarts each node of a 3-node cluster in turn, by
// rollingSteps, while writers tell and readers receive on every node
// throughout, and then checks the history against every invariant of
// check_test.go: nothing answered is lost, every retry and the replay of
// every answered tell names its seq, the readers get every record
// addressed to them. Each node stopped must exit 0 (a clean drain), and
// every writer must have a tell answered after each restart, so that
// the traffic ran across all of them. A failure leaves a report
// directory, as a failed seed does.
//
// It runs in `go test ./robustness` (about 30 s on a 2-core machine);
// -short skips it.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes for about 30 s; skipped under -short")
	}
	dir, err := os.MkdirTemp("", "robustness-rolling-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() && !*keep {
			os.RemoveAll(dir)
		}
	})
	// The release build (no test hook) of both commands: the "new
	// binaries" that step 4 installs where the nodes run theirs from.
	release := filepath.Join(dir, "release")
	if err := os.Mkdir(release, 0o700); err != nil {
		t.Fatal(err)
	}
	daemon, err := daemontest.Build(release)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := daemontest.BuildCommand(release, "participantctl")
	if err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(dir, "bin", "participantd")
	if err := install(daemon, installed); err != nil {
		t.Fatal(err)
	}

	h := newHarness(t, dir, installed, nodeCount)
	hist := newHistory()
	tl := &timeline{}
	r := &report{hist: hist, tl: tl, h: h, title: "Rolling restart",
		rerun: "go test ./robustness -run 'TestRollingRestart$' -v"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A conversation per node, each first owned by its node.
	convs := make([]uint64, nodeCount)
	for c := range convs {
		convs[c] = 9000 + uint64(c) + 1
	}
	writers, readers := startClients(ctx, t, h, hist, convs, true)
	tl.add(hist, "traffic starts: %d writers, %d readers, %d conversations", len(writers), len(readers), len(convs))
	began := time.Now()
	tctx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() { w.run(tctx) })
	}
	r.waitProgress(ctx, writers, time.Now(), "the traffic's start")

	rollingRestart(ctx, t, r, writers, dir, daemon, ctl, installed)

	stopTraffic()
	wg.Wait()
	r.duration = time.Since(began)
	tl.add(hist, "traffic ended")
	for _, nd := range h.nodes {
		for _, c := range nd.crashed() {
			r.violate(InvNodeAlive, fmt.Sprintf("node %s ended by itself at %d ms (%s); see %s", nd.id, hist.ms(c.at), c.state, nd.logPath))
		}
	}
	for _, w := range writers {
		wg.Go(func() { w.replay(ctx); w.detach(ctx) })
	}
	wg.Wait()
	tl.add(hist, "replays and detaches ended")

	logs, vs, err := readLogs(ctx, h.cli, h.prefix, convs)
	if err != nil {
		t.Fatalf("read the logs: %v", err)
	}
	r.violations = append(r.violations, vs...)
	r.waitDeliveries(ctx, logs, readers)
	ops, dels := hist.snapshot()
	r.violations = append(r.violations, checkHistory(ops, dels, logs)...)
	r.logs = logs
	// A rolling restart is invisible to the application but for latency:
	// the client follows moved and shutting_down by itself, so no call
	// ends refused, in doubt or with its participant lost (an oversized
	// tell, refused too_large by the client, apart).
	for _, op := range ops {
		if op.Outcome != Answered && op.Kind != "oversized" {
			r.violate(InvRollingAll, fmt.Sprintf("%s's %s %q (token %s, attempt %d, %d-%d ms) = %s: %s", op.Client, op.Kind, op.Payload, op.Token, op.Attempt, op.Start, op.End, op.Outcome, op.Err))
		}
	}

	tells := 0
	for _, l := range logs {
		tells += len(l.tells)
	}
	t.Logf("rolling restart of %d nodes under traffic: %d tells committed, %d attempts by the clients, %d deliveries, %v",
		nodeCount, tells, len(ops), len(dels), r.duration.Round(time.Millisecond))
	if len(r.violations) > 0 || t.Failed() {
		t.Errorf("rolling restart: %d violation(s); report %s\n%s", len(r.violations), r.write(dir), r.brief())
	} else if *keep {
		t.Logf("report: %s", r.write(dir))
	}
}

// rollingRestart carries out rollingSteps on r's nodes, recording each
// step in the timeline and each broken promise as a violation.
func rollingRestart(ctx context.Context, t *testing.T, r *report, writers []*writer, dir, daemon, ctl, installed string) {
	h, hist, tl := r.h, r.hist, r.tl
	step := func(n int, format string, args ...any) {
		tl.add(hist, "step %d: %s", n, fmt.Sprintf(format, args...))
	}

	// 1. A cluster backup through a node, checked.
	token, err := os.ReadFile(filepath.Join(h.dir, "data-"+h.nodes[0].id, "admin-token"))
	if err != nil {
		t.Fatalf("step 1: the admin token a loopback health listener writes: %v", err)
	}
	backupFile := filepath.Join(dir, "before.backup")
	out, err := command(ctx, []string{"PARTICIPANTCTL_ADMIN_TOKEN=" + strings.TrimSpace(string(token))},
		ctl, "backup", "--health", h.nodes[0].health, "--out", backupFile)
	step(1, "participantctl backup: %s%v", out, err)
	if err != nil {
		t.Fatalf("step 1: participantctl backup: %v\n%s", err, out)
	}
	out, err = command(ctx, nil, ctl, "verify", "--from", backupFile)
	step(1, "participantctl verify: %s%v", out, err)
	if err != nil {
		t.Fatalf("step 1: participantctl verify --from: %v\n%s", err, out)
	}

	restarted := map[*node]bool{}
	for range h.nodes {
		// Step 3 stops "one node": the test picks one that owns a
		// conversation now, if any does, so that its stop moves traffic.
		nd, owned := r.nextToRestart(ctx, restarted)
		restarted[nd] = true
		// 2. Every node ready.
		for _, other := range h.nodes {
			if out, err := command(ctx, nil, installed, "--healthcheck", "--health-listen", other.health); err != nil {
				t.Fatalf("step 2 before %s: node %s is not ready: %v\n%s", nd.id, other.id, err, out)
			}
		}
		step(2, "every node ready")

		// 3. SIGTERM, and wait for the process to exit 0.
		st, err := nd.stop()
		if err != nil {
			t.Fatalf("step 3: %v", err)
		}
		step(3, "SIGTERM %s (owner of conversations %v): %v", nd.id, owned, st)
		if !st.Success() {
			r.violate(InvCleanStop, fmt.Sprintf("node %s exited %v after SIGTERM; see %s", nd.id, st, nd.logPath))
		}

		// 4. The new binaries.
		if err := install(daemon, installed); err != nil {
			t.Fatalf("step 4: %v", err)
		}
		step(4, "installed %s", installed)

		// 5. Start, and wait until the healthcheck passes.
		started := time.Now()
		if err := nd.start(); err != nil {
			r.violate(InvNodeRestarts, fmt.Sprintf("node %s does not start again: %v", nd.id, err))
			return
		}
		if out, err := command(ctx, nil, installed, "--healthcheck", "--health-listen", nd.health); err != nil {
			t.Fatalf("step 5: %s ready but its healthcheck fails: %v\n%s", nd.id, err, out)
		}
		step(5, "%s started and ready in %v", nd.id, time.Since(started).Round(time.Millisecond))

		// Not a step: the traffic must have gone on across the restart
		// (else the rest proves nothing), and the next node waits for it.
		r.waitProgress(ctx, writers, started, "node "+nd.id+"'s restart")
	}
	step(6, "every node restarted")
}

// nextToRestart returns a node not in done that owns a conversation of
// the run now, as etcd's ownership keys say, with the conversations it
// owns; when none does, the first node not in done.
func (r *report) nextToRestart(ctx context.Context, done map[*node]bool) (*node, []string) {
	owned := map[string][]string{}
	resp, err := r.h.cli.Get(ctx, r.h.prefix+"own/", clientv3.WithPrefix())
	if err == nil {
		for _, kv := range resp.Kvs {
			var rec struct{ Node string }
			if json.Unmarshal(kv.Value, &rec) == nil {
				owned[rec.Node] = append(owned[rec.Node], strings.TrimPrefix(string(kv.Key), r.h.prefix+"own/"))
			}
		}
	}
	var first *node
	for _, nd := range r.h.nodes {
		if done[nd] {
			continue
		}
		if len(owned[nd.id]) > 0 {
			return nd, owned[nd.id]
		}
		if first == nil {
			first = nd
		}
	}
	return first, nil
}

// waitProgress waits, up to progressWait, until every writer has a tell
// that started after since answered; one that has none is a violation
// (the traffic stalled).
func (r *report) waitProgress(ctx context.Context, writers []*writer, since time.Time, after string) {
	deadline := time.NewTimer(progressWait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	from := r.hist.ms(since)
	for {
		ops, _ := r.hist.snapshot()
		waiting := map[string]bool{}
		for _, w := range writers {
			waiting[w.name] = true
		}
		for _, op := range ops {
			if op.Kind == "tell" && op.Outcome == Answered && op.Start >= from {
				delete(waiting, op.Client)
			}
		}
		if len(waiting) == 0 {
			r.tl.add(r.hist, "every writer had a tell answered after %s", after)
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			r.violate(InvRollingRun, fmt.Sprintf("after %s, %d writer(s) had no tell answered within %v: %v", after, len(waiting), progressWait, waiting))
			return
		case <-ctx.Done():
			return
		}
	}
}

// command runs bin with args and env (added to the test's), and returns
// its combined output.
func command(ctx context.Context, env []string, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// install copies the binary src to dst as an installer does: into a new
// file beside dst, renamed over it, so that a process running the old
// dst keeps its file.
func install(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".new"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o700)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// TestRollingRestart_DocsListTheSteps: docs/operations.md's numbered list
// under "Cluster (rolling restart)" is rollingSteps, which
// TestRollingRestart carries out.
func TestRollingRestart_DocsListTheSteps(t *testing.T) {
	got, err := docsSteps("../docs/operations.md", "**Cluster (rolling restart).**")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rollingSteps, got); diff != "" {
		t.Errorf("docs/operations.md's rolling restart differs from the steps TestRollingRestart carries out (-test +docs):\n%s", diff)
	}
}

// docsSteps returns the items of the first numbered list after the line
// that starts with heading in the Markdown file path, each item's lines
// joined by single spaces.
func docsSteps(path, heading string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	item := regexp.MustCompile(`^\d+\. `)
	var steps []string
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !found:
			found = strings.HasPrefix(line, heading)
		case item.MatchString(line):
			steps = append(steps, item.ReplaceAllString(line, ""))
		case len(steps) > 0 && strings.HasPrefix(line, "   ") && strings.TrimSpace(line) != "":
			steps[len(steps)-1] += " " + strings.TrimSpace(line)
		case len(steps) > 0:
			return steps, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%s: no line starts with %s", path, heading)
	}
	return steps, nil
}
