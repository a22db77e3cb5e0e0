package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
)

func init() {
	register(&command{
		name:     "inspect",
		synopsis: "describe a stopped server's data directory (offline)",
		usage: `[--data DIR [--space] | --etcd-endpoints URLS [--etcd-prefix P] | --from FILE] [--json]

Reads the store of a STOPPED server (it fails if participantd holds the data
directory) and prints, per conversation: its participants with generation,
retired, bound (as durably recorded: a stopped server's bindings end as
died/unclean_restart at its next start) and cursor; the last seq; the oplog
and outbox rows stored (and how many compaction removed); the token floor, when a token window has compacted
it (tokens drawn before it may have been forgotten); and, for an
unloadable conversation, its class and reason. Never writes.

With --etcd-endpoints it describes a cluster's data set under --etcd-prefix
(TLS and auth: the --etcd-* flags of participantd), read at one etcd
revision while the nodes keep serving, without writing or claiming
anything; "bound" is then as durably recorded at that revision. With
--from it describes a cluster backup file, checked whole first, without
etcd. The incarnation is per node in a cluster and is not shown.

--space reports instead where the bytes of the data file go: per bbolt
bucket its keys and the leaf and branch pages they occupy (allocated and
in use), split by key prefix (oplog, outbox, token, receipt, checkpoint,
...) with the average key and value size; and how much of the file no
bucket occupies (free pages and the freelist). It reads the file alone, so
stop the server first (it checkpoints its log into the file on the way
out; after a crash it names the log's records the figures leave out, and
a log it cannot read, which the next start would refuse, fails it after
the figures). It applies to a data directory only.`,
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
	space := fs.Bool("space", false, "report where the data file's bytes go, per bucket and key prefix")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if err := src.check(fs); err != nil {
		return err
	}
	if *space {
		if src.etcd.set() || *src.from != "" {
			return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--space reads a data directory's file: give --data, not --etcd-endpoints or --from")}
		}
		return runSpace(e, *src.dir, *asJSON)
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
		fmt.Fprintf(w, "\nconversation %d: oplog %s, outbox %s", c.Conversation,
			rowCount(c.OplogRows, c.OplogCompacted), rowCount(c.OutboxRows, c.OutboxCompacted))
		if c.Refused != nil {
			fmt.Fprintf(w, "\n  UNLOADABLE %s: %s\n", c.Refused.Class, c.Refused.Reason)
			printTokenFloor(w, c.TokenFloor)
			continue
		}
		fmt.Fprintf(w, ", last seq %d", c.LastSeq)
		if c.Repairs > 0 {
			fmt.Fprintf(w, ", %d outbox rows to repair at next start", c.Repairs)
		}
		fmt.Fprintln(w)
		printTokenFloor(w, c.TokenFloor)
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

// rowCount describes a stream's stored rows and, when compaction trimmed
// some, how many.
func rowCount(stored, compacted uint64) string {
	if compacted == 0 {
		return fmt.Sprintf("%d rows", stored)
	}
	return fmt.Sprintf("%d rows (%d compacted)", stored, compacted)
}

// printTokenFloor prints a conversation's token floor, if it has one.
func printTokenFloor(w io.Writer, floor time.Time) {
	if !floor.IsZero() {
		fmt.Fprintf(w, "  token floor %s (tokens drawn before it may be forgotten: their retries are token_expired)\n",
			floor.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	}
}

func runSpace(e *env, dir string, asJSON bool) error {
	st, err := openData(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	sp, err := st.Space()
	if err != nil {
		if errors.Is(err, store.ErrCorrupt) {
			return damaged(err)
		}
		return err
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sp)
	}
	printSpace(e.stdout, sp)
	// After a crash the file lacks the log's records: say so, since the
	// figures are the file's alone. A log that cannot be read (corrupt,
	// lost) fails the next start: that is an error, not a footnote.
	n, err := offline.Pending(dir, offlineOptions)
	if err != nil {
		return fmt.Errorf("the figures are the data file's alone: its write-ahead log cannot be read: %w", explainOpen(dir, err))
	}
	if n > 0 {
		fmt.Fprintf(e.stdout, "\nlog: %d records after the file's checkpoint are not in these figures (a crash left them; the next start, or compact, applies them)\n", n)
	}
	return nil
}

// leafHeader is what bbolt spends per key on a leaf page besides the key
// and the value.
const leafHeader = 16

func printSpace(w io.Writer, sp *boltfmt.Space) {
	var pages int64
	for _, b := range sp.Buckets {
		pages += b.LeafAlloc + b.BranchAlloc
	}
	fmt.Fprintf(w, "data file %.1f MiB, high water %.1f MiB (pages of %d B); buckets' pages %.1f MiB; the rest (free pages, freelist, meta) %.1f MiB\n",
		mib(sp.FileBytes), mib(sp.HighWaterBytes), sp.PageSize, mib(pages), mib(sp.HighWaterBytes-pages))
	for _, b := range sp.Buckets {
		fill := 0.0
		if b.LeafAlloc > 0 {
			fill = 100 * float64(b.LeafInuse) / float64(b.LeafAlloc)
		}
		if b.LeafAlloc == 0 {
			fmt.Fprintf(w, "\nbucket %s: %d keys, %d B inline in its parent's page\n", b.Name, b.Keys, b.InlineInuse)
		} else {
			fmt.Fprintf(w, "\nbucket %s: %d keys; leaf pages %.1f MiB, %.1f MiB in use (%.0f%%); branch pages %.1f MiB\n",
				b.Name, b.Keys, mib(b.LeafAlloc), mib(b.LeafInuse), fill, mib(b.BranchAlloc))
		}
		for _, p := range b.Prefixes {
			fmt.Fprintf(w, "  %-14s %10d keys, key %5.1f B, value %7.1f B: %.1f MiB with headers\n", p.Prefix, p.Keys,
				float64(p.KeyBytes)/float64(p.Keys), float64(p.ValueBytes)/float64(p.Keys), mib(p.KeyBytes+p.ValueBytes+leafHeader*int64(p.Keys)))
		}
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
