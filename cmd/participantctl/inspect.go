package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/participantd/participantd/participant"
)

func init() {
	register(&command{
		name:     "inspect",
		synopsis: "describe a stopped server's data directory (offline)",
		usage: `[--data DIR | --etcd-endpoints URLS [--etcd-prefix P] | --from FILE] [--json]

Reads the store of a STOPPED server (it fails if participantd holds the data
directory) and prints, per conversation: its participants with generation,
retired, bound (as durably recorded: a stopped server's bindings end as
died/unclean_restart at its next start) and cursor; the last seq; the oplog
and outbox row counts; and, for an unloadable conversation, its class and
reason. Never writes.

With --etcd-endpoints it describes a cluster's data set under --etcd-prefix
(TLS and auth: the --etcd-* flags of participantd), read at one etcd
revision while the nodes keep serving, without writing or claiming
anything; "bound" is then as durably recorded at that revision. With
--from it describes a cluster backup file, checked whole first, without
etcd. The incarnation is per node in a cluster and is not shown.`,
		run: runInspect,
	})
}

type inspectReport struct {
	Incarnation uint64 `json:"incarnation"`
	// Cluster describes a cluster data set (--etcd-endpoints, --from).
	Cluster       *clusterInfo         `json:"cluster,omitempty"`
	Conversations []participant.Report `json:"conversations"`
}

func runInspect(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["inspect"])
	src := addSourceFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON document")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := src.check(fs); err != nil {
		return err
	}
	inc, info, reports, err := inspectSource(ctx, e, src)
	if err != nil {
		return err
	}
	rep := inspectReport{Incarnation: inc, Cluster: info, Conversations: reports}
	if rep.Conversations == nil {
		rep.Conversations = []participant.Report{}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printInspect(e.stdout, &rep)
	return nil
}

func printInspect(w io.Writer, rep *inspectReport) {
	if rep.Cluster != nil {
		fmt.Fprintf(w, "%s, %d conversations\n", describeCluster(rep.Cluster), len(rep.Conversations))
	} else {
		fmt.Fprintf(w, "server incarnation %d, %d conversations\n", rep.Incarnation, len(rep.Conversations))
	}
	for _, c := range rep.Conversations {
		fmt.Fprintf(w, "\nconversation %d: oplog %d rows, outbox %d rows", c.Conversation, c.OplogRows, c.OutboxRows)
		if c.Refused != nil {
			fmt.Fprintf(w, "\n  UNLOADABLE %s: %s\n", c.Refused.Class, c.Refused.Reason)
			continue
		}
		fmt.Fprintf(w, ", last seq %d", c.LastSeq)
		if c.Repairs > 0 {
			fmt.Fprintf(w, ", %d outbox rows to repair at next start", c.Repairs)
		}
		fmt.Fprintln(w)
		for _, p := range c.Participants {
			fmt.Fprintf(w, "  participant %d: generation %d cursor %d", p.Participant, p.Generation, p.Cursor)
			if p.Retired {
				fmt.Fprint(w, " retired")
			}
			if p.Bound {
				fmt.Fprint(w, " bound")
			}
			fmt.Fprintln(w)
		}
	}
}
