package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/participantd/participantd/internal/cli"
)

func init() {
	register(&command{
		name:     "verify",
		synopsis: "reconcile a stopped server's data in dry run (offline)",
		usage: `[--data DIR | --etcd-endpoints URLS [--etcd-prefix P] | --from FILE] [--json]

Reads every page of a STOPPED server's store (opened read-only: not a byte
changes; a write-ahead log is replayed in memory and checked, a corrupt log
is an error naming the segment and offset), then reconciles every conversation as the server does at start,
without writing anything, and reports each as "ok", "would repair N outbox
rows" or "refused CLASS: REASON". It also checks the token index: a stored
row whose token a retry would not find (not forgotten below the token
floor) is refused token_index_missing. Exits 1 when the store is missing, empty
or damaged (naming the file and what to do), or when any conversation is
refused (the server would contain it as unloadable), else 0.

With --etcd-endpoints it reads a cluster's data set under --etcd-prefix
(TLS and auth: the --etcd-* flags of participantd) while the nodes keep
serving: every read is pinned at the etcd revision current at the start,
so the report is one consistent state, and nothing is written (no claims,
no repairs). With --from it reads a cluster backup file, checked whole
first (count and SHA-256), without etcd.`,
		run: runVerify,
	})
}

// describeCluster is the first line of verify and inspect on cluster data.
func describeCluster(info *clusterInfo) string {
	from := "etcd"
	if info.Backup != "" {
		from = "backup " + info.Backup
	}
	return fmt.Sprintf("cluster data set %s at etcd revision %d (%s), %d nodes", info.Prefix, info.Revision, from, len(info.Nodes))
}

type verifyLine struct {
	Conversation uint64 `json:"conversation"`
	Status       string `json:"status"` // ok, repair, refused
	RepairRows   int    `json:"repair_rows,omitempty"`
	Class        string `json:"class,omitempty"`
	Reason       string `json:"reason,omitempty"`
}

func runVerify(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["verify"])
	src := addSourceFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object per conversation")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if err := src.check(fs); err != nil {
		return err
	}
	_, info, reports, err := inspectSource(ctx, e, src)
	if err != nil {
		return err
	}
	if !*asJSON && info != nil {
		fmt.Fprintln(e.stdout, describeCluster(info))
	}
	if !*asJSON && info == nil {
		line, err := logSummary(*src.dir)
		if err != nil {
			return err
		}
		if line != "" {
			fmt.Fprintln(e.stdout, line)
		}
	}
	refused := 0
	for _, r := range reports {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := verifyLine{Conversation: uint64(r.Conversation), Status: "ok"}
		switch {
		case r.Refused != nil:
			l.Status, l.Class, l.Reason = "refused", r.Refused.Class, r.Refused.Reason
		case r.Repairs > 0:
			l.Status, l.RepairRows = "repair", r.Repairs
		}
		if l.Status == "refused" {
			refused++
		}
		if *asJSON {
			b, err := json.Marshal(l)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s\n", b)
			continue
		}
		switch l.Status {
		case "ok":
			fmt.Fprintf(e.stdout, "conversation %d: ok\n", l.Conversation)
		case "repair":
			fmt.Fprintf(e.stdout, "conversation %d: would repair %d outbox rows\n", l.Conversation, l.RepairRows)
		default:
			fmt.Fprintf(e.stdout, "conversation %d: refused %s: %s\n", l.Conversation, l.Class, l.Reason)
		}
	}
	if refused > 0 {
		return &cli.ExitError{Code: 1, Err: fmt.Errorf("%d of %d conversations refused", refused, len(reports))}
	}
	return nil
}
