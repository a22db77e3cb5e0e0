package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/server"
)

func init() {
	register(&command{
		name:     "status",
		synopsis: "show who owns a conversation, its participants, cursors and backlog (online)",
		usage: `[--health ADDR|URL] [--health-ca FILE] [--admin-token TOKEN] [--data DIR] [--json] [--no-follow] CONVERSATION

Asks a running server's health listener (GET /admin/conversations/ID; the
server needs --admin-token) about one conversation: which node owns it,
each participant's generation and binding (never a secret), its cursors
(acked: what it acknowledged; offered: the last record pushed to its
binding) and how many records it still holds back unacknowledged, and the
conversation's backlog. The token comes from --admin-token or
` + adminTokenEnv + `; without either, against a loopback --health, from
the ` + server.AdminTokenFile + ` file that participantd (started without an admin
token, its health listener on loopback) writes in its data directory
(--data, default ` + server.DefaultDataDir + `).

Against any node of a cluster: a node that does not own the conversation
names the owner, and status asks the owner's health listener in turn
(with the same token and --health-ca), unless --no-follow; then it prints
the owner. Nothing is claimed or loaded by asking.

--json prints the server's answer (the owner's, when followed) as JSON.`,
		run: runStatus,
	})
}

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["status"])
	health := fs.String("health", server.DefaultHealthListen, "the server's health listener: host:port, or a URL http://host:port or https://host:port")
	healthCA := fs.String("health-ca", "", "PEM CA verifying the health listeners' certificates (implies https)")
	token := fs.String("admin-token", "", "the server's admin token (default $"+adminTokenEnv+")")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	noFollow := fs.Bool("no-follow", false, "print the owner a non-owner names instead of asking it")
	dataDir := fs.String("data", server.DefaultDataDir, "the local server's data directory, whose "+server.AdminTokenFile+" file gives the token when none is set and --health is loopback")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("want exactly one conversation id")}
	}
	conv, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("conversation %q: want a number", fs.Arg(0))}
	}
	if *token, err = adminToken(e, *token, *health, *dataDir); err != nil {
		return err
	}
	st, err := askStatus(ctx, *health, *healthCA, *token, conv)
	if err != nil {
		return err
	}
	if !st.Here && st.Owner != nil && st.Owner.Health != "" && !*noFollow {
		asked, owner := st.Node, *st.Owner
		if st, err = askStatus(ctx, owner.Health, *healthCA, *token, conv); err != nil {
			return fmt.Errorf("node %s names node %s (wire %s, health %s) as the owner, which did not answer: %w",
				asked, owner.Node, owner.Addr, owner.Health, err)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(e.stdout, st)
	return nil
}

// askStatus GETs the status of conversation conv from the health listener
// at health.
func askStatus(ctx context.Context, health, ca, token string, conv uint64) (server.ConversationStatus, error) {
	var st server.ConversationStatus
	base, hc, err := healthClient(health, ca)
	if err != nil {
		return st, &cli.ExitError{Code: cli.ExitUsage, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/admin/conversations/"+strconv.FormatUint(conv, 10), nil)
	if err != nil {
		return st, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		switch {
		case resp.StatusCode == http.StatusNotFound && strings.Contains(string(msg), server.NoSuchConversation):
			return st, fmt.Errorf("no conversation %d at %s", conv, base)
		case resp.StatusCode == http.StatusNotFound:
			// The route itself is missing.
			return st, fmt.Errorf("%s serves no admin endpoints: start participantd with --admin-token-file (or it predates status)", base)
		}
		return st, fmt.Errorf("%s answered %s: %s", base, resp.Status, strings.TrimSpace(string(msg)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("%s: unreadable answer: %w", base, err)
	}
	return st, nil
}

// printStatus prints st as a few labelled lines and a table of the
// participants.
func printStatus(w io.Writer, st server.ConversationStatus) {
	fmt.Fprintf(w, "conversation %d\n", st.Conversation)
	switch o := st.Owner; {
	case st.Node == "":
		fmt.Fprintf(w, "owner:     this node (single node)\n")
	case o == nil:
		fmt.Fprintf(w, "owner:     none now; the next operation on it, at any node, claims it\n")
	default:
		fmt.Fprintf(w, "owner:     node %s, wire %s, health %s\n", o.Node, o.Addr, orNone(o.Health))
	}
	if !st.Here {
		if st.Node != "" && st.Owner != nil {
			fmt.Fprintf(w, "asked:     node %s, which does not serve it; ask the owner's health listener for the rest\n", st.Node)
		}
		return
	}
	if !st.Loaded {
		if u := st.Unloadable; u != nil {
			fmt.Fprintf(w, "state:     unloadable (%s): %s\n", u.Class, u.Reason)
		} else {
			fmt.Fprintf(w, "state:     not loaded (reloading after a failed commit, or its ownership lapsed)\n")
		}
		return
	}
	fmt.Fprintf(w, "state:     loaded, %d oplog rows, last seq %d\n", st.OplogRows, st.LastSeq)
	b := st.Backlog
	if b.Records == 0 {
		fmt.Fprintf(w, "backlog:   none\n")
	} else {
		fmt.Fprintf(w, "backlog:   %d records from seq %d, %d payload bytes in memory, %d evicted\n", b.Records, b.FirstSeq, b.MemoryBytes, b.EvictedBytes)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTICIPANT\tGENERATION\tBINDING\tACKED\tOFFERED\tUNACKED\tRELEASED")
	for _, p := range st.Participants {
		binding := "unbound"
		switch {
		case p.Retired:
			binding = "retired"
		case p.Bound:
			binding = "bound " + p.Connection
		}
		released := "-"
		if p.Released != 0 {
			released = strconv.FormatUint(p.Released, 10)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%d\t%s\n", p.Participant, p.Generation, binding, p.Acked, p.Offered, p.Unacked, released)
	}
	tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(not advertised)"
	}
	return s
}
