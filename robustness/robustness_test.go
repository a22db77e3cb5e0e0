package robustness_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/internal/daemontest"
)

var (
	duration = flag.Duration("robustness.duration", 0, "how long each seed's traffic and nemesis run (0: the short run, 15s a seed)")
	seedList = flag.String("robustness.seeds", "", "comma-separated seeds (empty: the short run's fixed seeds 1,2)")
	keep     = flag.Bool("robustness.keep", false, "keep every run's report directory, not only those of failed runs")
	only     = flag.String("robustness.nemeses", "", "comma-separated nemeses the schedule draws from (empty: all), to tell which fault finds a failure")
)

// The short run of `go test ./...`: two fixed seeds of 15 s of traffic
// each, about 90 s in all with the starts, checks and restores on a 2-core
// machine (the build and, while a reader does not follow a failover, the
// readers' wait come on top).
const shortDuration = 15 * time.Second

var shortSeeds = []uint64{1, 2}

// The shape of the traffic: conversations, writers per conversation,
// readers per conversation.
const (
	conversations = 2
	writersPer    = 2
	readersPer    = 1
	nodeCount     = 3
)

// readerCheck is the readers' BindingCheckInterval. A node that lost its
// lease while its connections stayed up (a pause longer than the lease)
// forgets their bindings without a word; a reader that sends nothing
// learns it only from its binding check, and then follows its
// conversation. The client's default (30 s) is longer than a run.
const readerCheck = leaseTTL

// deliveryWait bounds how long the check waits, after the traffic and
// the replays ended (every fault healed), for the readers to receive
// every record addressed to them: a reader that follows its conversation
// catches up within a failover (a lease to expire, a claim) and a
// binding check, with room for a loaded machine.
const deliveryWait = 4*leaseTTL + 2*readerCheck

// The participantd binary, built once per test binary with the faulthook
// tag (the clock hook) into binDir, which TestMain removes.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func buildBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "robustness-bin-"); binErr == nil {
			binPath, binErr = daemontest.Build(binDir, "faulthook")
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// chosenNemeses returns the nemeses -robustness.nemeses names.
func chosenNemeses(t *testing.T) []nemesis {
	if *only == "" {
		return nemeses
	}
	var out []nemesis
	for _, name := range strings.Split(*only, ",") {
		found := false
		for _, n := range nemeses {
			if n.name == strings.TrimSpace(name) {
				out, found = append(out, n), true
			}
		}
		if !found {
			t.Fatalf("-robustness.nemeses: no nemesis %q", name)
		}
	}
	return out
}

func seeds(t *testing.T) []uint64 {
	if *seedList == "" {
		return shortSeeds
	}
	var out []uint64
	for _, s := range strings.Split(*seedList, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("-robustness.seeds: %v", err)
		}
		out = append(out, n)
	}
	return out
}

// TestRobustness runs, per seed, three participantd processes over a
// 3-member etcd with writers and readers as traffic and the seed's
// nemesis schedule, then checks the history against every invariant of
// check_test.go. A failed seed leaves a report directory (named in the
// failure) with the seed, the schedule, the history and the node logs.
func TestRobustness(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes for minutes; skipped under -short")
	}
	d := *duration
	if d == 0 {
		d = shortDuration
	}
	bin := buildBinary(t)
	for _, seed := range seeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			dir, err := os.MkdirTemp("", fmt.Sprintf("robustness-seed%d-", seed))
			if err != nil {
				t.Fatal(err)
			}
			// The directory goes when the seed passed, after every other
			// cleanup (registered first, it runs last): etcd's members
			// and the nodes still run in dir until theirs, and a member
			// whose directory vanished under it exits the test binary
			// (a fatal "failed to purge snap file").
			t.Cleanup(func() {
				if !t.Failed() && !*keep {
					os.RemoveAll(dir)
				}
			})
			r := runSeed(t, bin, dir, seed, d)
			if len(r.violations) == 0 && !t.Failed() {
				if *keep {
					t.Logf("report: %s", r.write(dir))
				}
				return
			}
			path := r.write(dir)
			t.Errorf("seed %d: %d violation(s); report %s\n%s", seed, len(r.violations), path, r.brief())
		})
	}
}

// runSeed is one run: start, traffic under the nemesis, heal, check.
func runSeed(t *testing.T, bin, dir string, seed uint64, d time.Duration) *report {
	h := newHarness(t, dir, bin, nodeCount)
	hist := newHistory()
	tl := &timeline{}
	events := plan(seed, d, nodeCount, chosenNemeses(t))
	r := &report{seed: seed, duration: d, events: events, hist: hist, tl: tl, h: h}

	// After the traffic, the checks, the backup and the restore race take
	// time that grows with what the traffic wrote (a 10-minute run's
	// restore copied 67,000 keys over a slowed link): the run's budget
	// grows with d too, so that a long run's restore phase never fails
	// for a deadline of the harness's own.
	ctx, cancel := context.WithTimeout(context.Background(), 2*d+5*time.Minute)
	defer cancel()
	convs := make([]uint64, conversations)
	for c := range convs {
		convs[c] = 1000*seed + uint64(c) + 1
	}
	writers, readers := startClients(ctx, t, h, hist, convs, false)
	tl.add(hist, "traffic starts: %d writers, %d readers, %d conversations", len(writers), len(readers), conversations)
	tctx, stopTraffic := context.WithTimeout(ctx, d)
	defer stopTraffic()
	var wg sync.WaitGroup
	for _, w := range writers {
		wg.Go(func() { w.run(tctx) })
	}
	if err := runNemesis(tctx, h, hist, tl, seed, events, r.violate); err != nil {
		r.violate(InvNodeAlive, err.Error())
	}
	<-tctx.Done()
	wg.Wait()
	tl.add(hist, "traffic ended")

	// No node process may have ended by itself (a kill nemesis may have
	// restarted it since); every node must run for the replays, in which
	// every answered tell is resent with its token.
	for _, nd := range h.nodes {
		for _, c := range nd.crashed() {
			r.violate(InvNodeAlive, fmt.Sprintf("node %s ended by itself at %d ms (%s); see %s", nd.id, hist.ms(c.at), c.state, nd.logPath))
		}
		if !nd.running() {
			if err := nd.start(); err != nil {
				r.violate(InvNodeAlive, fmt.Sprintf("node %s does not start again: %v", nd.id, err))
			}
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
	tl.add(hist, "check")
	ops, dels := hist.snapshot()
	r.violations = append(r.violations, checkHistory(ops, dels, logs)...)
	r.logs = logs

	r.violations = append(r.violations, checkRestore(ctx, seed, h, hist, tl, logs, convs, writers)...)
	return r
}

// startClients connects the run's clients to h's nodes: per conversation
// of convs, readersPer readers, each enrolled (first, so that every tell
// is addressed to it) and reading, and writersPer writers, not yet
// running. With rotate, the clients of the i-th conversation list the
// nodes from the i-th on as their seeds, so that (their reader enrolling
// first) each node comes to own a conversation; else every client lists
// them in order. The clients close when t ends.
func startClients(ctx context.Context, t *testing.T, h *harness, hist *history, convs []uint64, rotate bool) ([]*writer, []*reader) {
	t.Helper()
	opts := client.ClusterOptions{Options: client.Options{ClientName: "robustness", MaxBackoff: 500 * time.Millisecond}}
	var writers []*writer
	var readers []*reader
	for c, conv := range convs {
		seeds := h.seeds()
		if rotate {
			k := c % len(seeds)
			seeds = append(seeds[k:], seeds[:k]...)
		}
		// A reader joins first, so that every tell is addressed to it.
		for i := range readersPer {
			ropts := opts
			ropts.BindingCheckInterval = readerCheck
			cl, err := client.DialCluster(ctx, seeds, ropts)
			if err != nil {
				t.Fatalf("reader: %v", err)
			}
			t.Cleanup(func() { cl.Close() })
			rd := &reader{name: fmt.Sprintf("reader-c%d-%d", conv, i), conv: conv, hist: hist, cl: cl}
			go rd.read()
			if err := rd.enroll(ctx); err != nil {
				t.Fatal(err)
			}
			readers = append(readers, rd)
		}
		for i := range writersPer {
			wopts := opts
			wopts.DiscardDeliveries = true
			dial := func(ctx context.Context) (*client.Cluster, error) {
				dctx, cancel := context.WithTimeout(ctx, callTimeout)
				defer cancel()
				return client.DialCluster(dctx, seeds, wopts)
			}
			cl, err := dial(ctx)
			if err != nil {
				t.Fatalf("writer: %v", err)
			}
			w := &writer{name: fmt.Sprintf("writer-c%d-%d", conv, i), conv: conv, hist: hist, cl: cl, dial: dial}
			t.Cleanup(func() { w.cl.Close() })
			writers = append(writers, w)
		}
	}
	return writers, readers
}

// waitDeliveries waits, up to deliveryWait, until every reader received
// every record addressed to it in logs.
func (r *report) waitDeliveries(ctx context.Context, logs map[uint64]*convLog, readers []*reader) {
	deadline := time.NewTimer(deliveryWait)
	defer deadline.Stop()
	for {
		_, dels := r.hist.snapshot()
		n := missing(logs, dels, readers)
		if n == 0 {
			return
		}
		select {
		case <-r.hist.delivered:
		case <-deadline.C:
			r.tl.add(r.hist, "the readers still miss %d records %v after the traffic ended", n, deliveryWait)
			return
		case <-ctx.Done():
			return
		}
	}
}

// missing counts the records addressed to a reader in logs that it has
// not received.
func missing(logs map[uint64]*convLog, dels []Delivery, readers []*reader) int {
	got := map[string]map[uint64]bool{}
	for _, d := range dels {
		if got[d.Reader] == nil {
			got[d.Reader] = map[uint64]bool{}
		}
		got[d.Reader][d.Seq] = true
	}
	n := 0
	for _, rd := range readers {
		if l := logs[rd.conv]; l != nil {
			n += len(undelivered(l, rd.participant, got[rd.name]))
		}
	}
	return n
}
