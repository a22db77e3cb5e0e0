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
		usage: `[--data DIR] [--json]

Reads the store of a STOPPED server (it fails if participantd holds the data
directory) and prints, per conversation: its participants with generation,
retired, bound (as durably recorded: a stopped server's bindings end as
died/unclean_restart at its next start) and cursor; the last seq; the oplog
and outbox row counts; and, for an unloadable conversation, its class and
reason. Never writes.`,
		run: runInspect,
	})
}

type inspectReport struct {
	Incarnation   uint64               `json:"incarnation"`
	Conversations []conversationReport `json:"conversations"`
}

type conversationReport struct {
	Conversation uint64              `json:"conversation"`
	OplogRows    int                 `json:"oplog_rows"`
	OutboxRows   int                 `json:"outbox_rows"`
	LastSeq      uint64              `json:"last_seq"`
	Participants []participantReport `json:"participants,omitempty"`
	// RepairRows is how many outbox rows the next start appends.
	RepairRows int `json:"repair_rows,omitempty"`
	// Unloadable is set for a conversation the server contains.
	Unloadable *refusal `json:"unloadable,omitempty"`
}

type participantReport struct {
	Participant uint64 `json:"participant"`
	Generation  uint64 `json:"generation"`
	Retired     bool   `json:"retired"`
	Bound       bool   `json:"bound"`
	Cursor      uint64 `json:"cursor"`
}

func runInspect(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["inspect"])
	dir := addDataFlag(fs)
	asJSON := fs.Bool("json", false, "print one JSON document")
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := openData(*dir)
	if err != nil {
		return err
	}
	defer st.Close()
	inc, err := st.ReadValue(participant.IncarnationKey)
	if err != nil {
		return fmt.Errorf("read incarnation: %w", err)
	}
	ids, err := readRegistry(st)
	if err != nil {
		return err
	}
	rep := inspectReport{Incarnation: inc, Conversations: []conversationReport{}}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := reconcileDry(st, id)
		if err != nil {
			rep.Conversations = append(rep.Conversations, conversationReport{Conversation: uint64(id),
				Unloadable: &refusal{participant.ClassStorageUnavailable, err.Error()}})
			continue
		}
		cr := conversationReport{Conversation: uint64(id), OplogRows: r.oplogRows, OutboxRows: r.outboxRows,
			RepairRows: r.repairs, Unloadable: r.refused}
		if r.state != nil {
			cr.LastSeq = uint64(r.state.LastSeq)
			for i, m := range r.state.Members {
				cr.Participants = append(cr.Participants, participantReport{Participant: uint64(i),
					Generation: uint64(m.Generation), Retired: m.Retired, Bound: m.Bound, Cursor: uint64(m.Cursor)})
			}
		}
		rep.Conversations = append(rep.Conversations, cr)
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
	fmt.Fprintf(w, "server incarnation %d, %d conversations\n", rep.Incarnation, len(rep.Conversations))
	for _, c := range rep.Conversations {
		fmt.Fprintf(w, "\nconversation %d: oplog %d rows, outbox %d rows", c.Conversation, c.OplogRows, c.OutboxRows)
		if c.Unloadable != nil {
			fmt.Fprintf(w, "\n  UNLOADABLE %s: %s\n", c.Unloadable.Class, c.Unloadable.Reason)
			continue
		}
		fmt.Fprintf(w, ", last seq %d", c.LastSeq)
		if c.RepairRows > 0 {
			fmt.Fprintf(w, ", %d outbox rows to repair at next start", c.RepairRows)
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
