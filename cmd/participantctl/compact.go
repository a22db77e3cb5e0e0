package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
)

func init() {
	register(&command{
		name:     "compact",
		synopsis: "checkpoint and compact a stopped server's data (offline)",
		usage: `--data DIR [--retain DURATION] [--json]

Writes a checkpoint of every conversation of a STOPPED server's store and
removes the history that no participant can still receive and that was
settled more than --retain ago (default 168h, as the server), keeping a
receipt for every committed token so that its retries still replay. A
conversation that would be refused, or that needs a repair at the next
start, is left alone and listed. Exits 1 when any conversation was left
alone, else 0.

A data directory with a write-ahead log (participantd's default engine)
is first brought up to date with it, as participantd's start does, and
compact writes through the log: a directory a crash or kill left is
compacted whole, and the next start finds what compact wrote.`,
		run: runCompact,
	})
}

type compactLine struct {
	Checkpoints   int      `json:"checkpoints"`
	Conversations int      `json:"conversations_compacted"`
	OplogRows     uint64   `json:"oplog_rows_removed"`
	OutboxRows    uint64   `json:"outbox_rows_removed"`
	Receipts      int      `json:"receipts_written"`
	Forgotten     int      `json:"tokens_forgotten"`
	Skipped       []string `json:"skipped,omitempty"`
}

func runCompact(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["compact"])
	dir := addDataFlag(fs)
	retain := fs.Duration("retain", participant.DefaultRetain, "keep settled history this long after the acknowledgement that settled it")
	window := fs.Duration("token-window", 0, "the daemon's --token-window: forget the tokens of compacted rows older than it instead of writing their receipts (0: keep every token's answer forever)")
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *retain <= 0 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--retain must be positive")}
	}
	if *window < 0 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--token-window must not be negative")}
	}
	// The daemon's open, the log replayed into the file first: a log
	// record the file lacks would otherwise be replayed over what compact
	// writes at the next start (an older token floor under forgotten
	// entries; an older checkpoint over trimmed rows).
	rep, err := offline.Compact(ctx, *dir, offlineOptions, participant.Options{Retain: *retain, TokenWindow: *window, Now: time.Now})
	if err != nil {
		return explainOpen(*dir, err)
	}
	l := compactLine{Checkpoints: rep.Checkpoints, Conversations: rep.Compacted.Conversations,
		OplogRows: rep.Compacted.OplogRows, OutboxRows: rep.Compacted.OutboxRows, Receipts: rep.Compacted.Receipts, Forgotten: rep.Compacted.Forgotten}
	for _, u := range rep.Skipped {
		l.Skipped = append(l.Skipped, fmt.Sprintf("conversation %d: %s: %s", u.Conversation, u.Class, u.Reason))
	}
	if *asJSON {
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s\n", b)
	} else {
		fmt.Fprintf(e.stdout, "%d checkpoints written; %d conversations compacted: %d oplog rows and %d outbox rows removed, %d receipts written, %d tokens forgotten\n",
			l.Checkpoints, l.Conversations, l.OplogRows, l.OutboxRows, l.Receipts, l.Forgotten)
		for _, s := range l.Skipped {
			fmt.Fprintf(e.stdout, "left alone: %s\n", s)
		}
	}
	if len(rep.Skipped) > 0 {
		return &cli.ExitError{Code: 1, Err: fmt.Errorf("%d conversations left alone", len(rep.Skipped))}
	}
	return nil
}
