package robustness_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// report is one seed's run, written out when it fails (etcd robustness's
// report: everything needed to understand the failure without running it
// again, and the command that runs it again).
type report struct {
	seed     uint64
	duration time.Duration
	events   []event
	hist     *history
	tl       *timeline
	h        *harness
	logs     map[uint64]*convLog
	// title and rerun replace the seed's heading and the command that
	// runs the seed again, for a run that is not a seed of TestRobustness.
	title, rerun string

	mu         sync.Mutex
	violations []Violation
}

func (r *report) violate(inv, detail string) {
	r.mu.Lock()
	r.violations = append(r.violations, Violation{inv, detail})
	r.mu.Unlock()
}

// hints are the issue-17 failures a violated invariant has pointed to.
var hints = map[string]string{
	InvAnsweredOnce:   "an answered operation lost or moved: stale reads of the scope (issue 17 #1, #2, #10)",
	InvNoDoubleCommit: "a retry decided as new from a stale read (#1, #10), or a token not carried across nodes (#4)",
	InvRetryReplays:   "a retry decided as new (#1, #2, #10)",
	InvRefusedNotDone: "a committed retry refused from a stale read (#2, #8, #10)",
	InvKeepsBinding:   "a committed attach refused stale_authority on a retry (#2), or an attach token not carried to the new owner (#4)",
	InvNoFork:         "two owners wrote one conversation (#3, #5, #6)",
	InvBindingsEnd:    "an ending recorded twice across a failover (#5, #6)",
	InvLoadable:       "a stale checkpoint or a half-written state (#3, #11)",
	InvReaderOrdered:  "the cluster client's deduplication across nodes",
	InvReaderMatches:  "a push of state another owner replaced (#6, #7)",
	InvReaderComplete: "a reader that does not follow its conversation to the new owner (#9)",
	InvNodeAlive:      "a node crash on a lease loss (#5)",
	InvNodeRestarts:   "a restart within a lease of the crash: the new lease expires while Start waits for the old registration (cluster/node.go acquireLease)",
	InvRestore:        "the restore race (#11), or a backup that is not one revision",
	InvTooLargeFinal:  "a size not checked against max_record_bytes before sending (issue 26 #6)",
	InvNotStuck:       "a call without a bound of its own: an answer dropped on an open connection, or a moved storm (issue 26 #7)",
	InvDetachHolds:    "an automatic re-attach before, or after, the detach's retry (issue 26 #1)",
	InvCleanStop:      "a drain past --drain-timeout, or a store close that failed or hung (server.Run's error, in the node's log)",
	InvRollingRun:     "a drained node's conversations not claimed by the others, or a client that does not follow them",
	InvRollingAll:     "a drain that closes a connection with a request unanswered, or a client that gives up on shutting_down or moved",
}

// brief is the failure message's body: the violations, at most three per
// invariant.
func (r *report) brief() string {
	var b strings.Builder
	for _, g := range r.grouped() {
		fmt.Fprintf(&b, "  %s (%d): %s\n", g.inv, len(g.vs), hints[g.inv])
		for i, v := range g.vs {
			if i == 3 {
				fmt.Fprintf(&b, "    ... %d more in the report\n", len(g.vs)-3)
				break
			}
			fmt.Fprintf(&b, "    - %s\n", v.Detail)
		}
	}
	return b.String()
}

type group struct {
	inv string
	vs  []Violation
}

func (r *report) grouped() []group {
	r.mu.Lock()
	defer r.mu.Unlock()
	by := map[string][]Violation{}
	for _, v := range r.violations {
		by[v.Invariant] = append(by[v.Invariant], v)
	}
	var out []group
	for inv, vs := range by {
		out = append(out, group{inv, vs})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].inv < out[j].inv })
	return out
}

// write writes REPORT.md, history.jsonl and deliveries.jsonl into dir
// (beside the node logs and etcd's data) and returns REPORT.md's path.
func (r *report) write(dir string) string {
	ops, dels := r.hist.snapshot()
	writeJSONL(filepath.Join(dir, "history.jsonl"), ops)
	writeJSONL(filepath.Join(dir, "deliveries.jsonl"), dels)

	var b strings.Builder
	if r.title != "" {
		fmt.Fprintf(&b, "# %s\n\nRun it again: `%s`\n\n", r.title, r.rerun)
	} else {
		fmt.Fprintf(&b, "# Robustness run, seed %d\n\n", r.seed)
		nem := ""
		if *only != "" {
			nem = " -robustness.nemeses=" + *only
		}
		fmt.Fprintf(&b, "Run it again: `go test ./robustness -run 'TestRobustness/seed=%d$' -robustness.seeds=%d -robustness.duration=%v%s -v`\n\n",
			r.seed, r.seed, r.duration, nem)
	}
	fmt.Fprintf(&b, "%d nodes (lease %v) over a 3-member etcd; %d conversations, %d writers and %d reader(s) each; traffic for %v.\n\n",
		nodeCount, leaseTTL, conversations, writersPer, readersPer, r.duration)

	fmt.Fprintf(&b, "## Violations\n\n")
	if len(r.violations) == 0 {
		fmt.Fprintf(&b, "None.\n\n")
	}
	for _, g := range r.grouped() {
		fmt.Fprintf(&b, "### %s: %d\n\nLikely: %s.\n\n", g.inv, len(g.vs), hints[g.inv])
		for i, v := range g.vs {
			if i == 50 {
				fmt.Fprintf(&b, "- ... %d more\n", len(g.vs)-50)
				break
			}
			fmt.Fprintf(&b, "- %s\n", v.Detail)
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "## Nemesis schedule (planned from the seed)\n\n```\n")
	for _, e := range r.events {
		fmt.Fprintf(&b, "%s\n", e)
	}
	fmt.Fprintf(&b, "```\n\n## Timeline (what happened, ms since the start)\n\n```\n%s\n```\n\n", strings.Join(r.tl.lines(), "\n"))

	fmt.Fprintf(&b, "## Traffic\n\n| client | answered | refused | unknown | lost |\n|---|---|---|---|---|\n")
	type counts struct{ answered, refused, unknown, lost int }
	per := map[string]*counts{}
	var names []string
	for _, op := range ops {
		c := per[op.Client]
		if c == nil {
			c = &counts{}
			per[op.Client] = c
			names = append(names, op.Client)
		}
		switch op.Outcome {
		case Answered:
			c.answered++
		case Refused:
			c.refused++
		case Unknown:
			c.unknown++
		case Lost:
			c.lost++
		}
	}
	sort.Strings(names)
	for _, n := range names {
		c := per[n]
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", n, c.answered, c.refused, c.unknown, c.lost)
	}
	delivered := map[string]int{}
	for _, d := range dels {
		delivered[d.Reader]++
	}
	fmt.Fprintf(&b, "\n| reader | deliveries |\n|---|---|\n")
	var rnames []string
	for n := range delivered {
		rnames = append(rnames, n)
	}
	sort.Strings(rnames)
	for _, n := range rnames {
		fmt.Fprintf(&b, "| %s | %d |\n", n, delivered[n])
	}
	if r.logs != nil {
		fmt.Fprintf(&b, "\n| conversation | tells in the log | records |\n|---|---|---|\n")
		var convs []uint64
		for c := range r.logs {
			convs = append(convs, c)
		}
		sort.Slice(convs, func(i, j int) bool { return convs[i] < convs[j] })
		for _, c := range convs {
			fmt.Fprintf(&b, "| %d | %d | %d |\n", c, len(r.logs[c].tells), len(r.logs[c].records))
		}
	}

	fmt.Fprintf(&b, "\n## Nodes\n\n")
	for _, nd := range r.h.nodes {
		fmt.Fprintf(&b, "### %s (%s)\n\nLog: `%s`. Its warnings and errors, the last 15:\n\n```\n%s\n```\n\n",
			nd.id, nd.exitStatus(), nd.logPath, strings.Join(tailWarnings(nd.logPath, 15), "\n"))
	}
	fmt.Fprintf(&b, "## Files\n\n- `history.jsonl`: every attempt of every operation (client, kind, token, payload, outcome, seq, error, times)\n"+
		"- `deliveries.jsonl`: every delivery each reader received\n- `node-*.log`: the nodes' logs (JSON lines, across restarts)\n- `etcd/`: the members' data\n")
	path := filepath.Join(dir, "REPORT.md")
	os.WriteFile(path, []byte(b.String()), 0o600)
	return path
}

func writeJSONL[T any](path string, items []T) {
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, it := range items {
		enc.Encode(it)
	}
	w.Flush()
}

// tailWarnings returns the last n lines of a node log at level warn or
// above, and the robustness harness's own start lines.
func tailWarnings(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) || strings.Contains(l, `"level":"fatal"`) ||
			strings.HasPrefix(l, `{"robustness":`) || strings.HasPrefix(l, "panic") || strings.HasPrefix(l, "fatal") {
			out = append(out, l)
			if len(out) > n {
				out = out[1:]
			}
		}
	}
	return out
}
