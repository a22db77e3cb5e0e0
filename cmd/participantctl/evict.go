package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/server"
)

func init() {
	register(&command{
		name:     "evict",
		synopsis: "retire a participant of a running server, as if it had left (online, audited)",
		usage: `--conversation C --participant P [--health ADDR|URL] [--health-ca FILE] [--admin-token TOKEN] [--json]

Asks the running server's health listener (POST /admin/evict; the server
needs --admin-token) to retire participant P of conversation C: a leave
with cause "evicted" commits through the usual two barriers, its binding
ends, the records only it had yet to acknowledge are reclaimed, and its
credential answers retired from then on. The other members receive left
with cause evicted. The server logs who asked and what was done.

In a cluster, ask the node that owns the conversation: another node
answers moved with the owner's address. The token comes from --admin-token
or ` + adminTokenEnv + `. With --json the answer is one JSON object:
result ("evicted"), conversation, participant and seq (of its left record).`,
		run: func(ctx context.Context, e *env, args []string) error { return runEvict(ctx, e, "evict", args) },
	})
	register(&command{
		name:     "drop",
		synopsis: "retire every participant of a conversation of a running server (online, audited)",
		usage: `--conversation C [--health ADDR|URL] [--health-ca FILE] [--admin-token TOKEN] [--json]

Asks the running server's health listener (POST /admin/drop) to evict
every participant of conversation C that has not left, in one commit (see
evict): all its records are reclaimed, and its history goes after the
retention period like any settled history. With --json the answer is one
JSON object: result ("dropped"), conversation, and evicted, a list of
participant and seq (of its left record).`,
		run: func(ctx context.Context, e *env, args []string) error { return runEvict(ctx, e, "drop", args) },
	})
}

func runEvict(ctx context.Context, e *env, name string, args []string) error {
	fs := newFlagSet(e, commands[name])
	conv := fs.String("conversation", "", "the conversation")
	var part *string
	if name == "evict" {
		part = fs.String("participant", "", "the participant to evict")
	}
	health, healthCA, token := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print the server's answer as one JSON object")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *token == "" {
		*token = e.getenv(adminTokenEnv)
	}
	q := url.Values{}
	if _, err := strconv.ParseUint(*conv, 10, 64); err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--conversation is required: an unsigned integer")}
	}
	q.Set("conversation", *conv)
	if part != nil {
		if _, err := strconv.ParseUint(*part, 10, 64); err != nil {
			return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--participant is required: an unsigned integer")}
		}
		q.Set("participant", *part)
	}
	if *token == "" {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("an admin token is required (--admin-token or " + adminTokenEnv + ")")}
	}
	base, hc, err := healthClient(*health, *healthCA)
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/admin/"+name+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+*token)
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		var refusal struct{ Code, Detail, Owner string }
		if json.Unmarshal(body, &refusal) != nil || refusal.Code == "" {
			return fmt.Errorf("%s: the server answered %s: %.512s", name, resp.Status, body)
		}
		if refusal.Owner != "" {
			return fmt.Errorf("%s: %s: %s (the owner is %s: ask its health listener)", name, refusal.Code, refusal.Detail, refusal.Owner)
		}
		return fmt.Errorf("%s: %s: %s", name, refusal.Code, refusal.Detail)
	}
	var done struct {
		Participant uint64
		Seq         uint64
		Evicted     []struct{ Participant, Seq uint64 }
	}
	if err := json.Unmarshal(body, &done); err != nil {
		return fmt.Errorf("%s: the server's answer: %w", name, err)
	}
	if *asJSON {
		c, _ := strconv.ParseUint(*conv, 10, 64) // checked above
		r := evictResult{Result: "evicted", Conversation: c, Participant: &done.Participant, Seq: done.Seq}
		if name == "drop" {
			r = evictResult{Result: "dropped", Conversation: c, Evicted: []evicted{}}
			for _, x := range done.Evicted {
				r.Evicted = append(r.Evicted, evicted{x.Participant, x.Seq})
			}
		}
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		return err
	}
	if name == "evict" {
		fmt.Fprintf(e.stdout, "participant %d of conversation %s evicted at seq %d\n", done.Participant, *conv, done.Seq)
		return nil
	}
	fmt.Fprintf(e.stdout, "conversation %s dropped: %d participants evicted\n", *conv, len(done.Evicted))
	for _, x := range done.Evicted {
		fmt.Fprintf(e.stdout, "  participant %d at seq %d\n", x.Participant, x.Seq)
	}
	return nil
}

// adminFlags defines the flags that reach a server's admin endpoints.
func adminFlags(fs *pflag.FlagSet) (health, healthCA, token *string) {
	health = fs.String("health", server.DefaultHealthListen, "the server's health listener: host:port, or a URL http://host:port or https://host:port")
	healthCA = fs.String("health-ca", "", "PEM CA verifying the health listener's certificate (implies https)")
	token = fs.String("admin-token", "", "the server's admin token (default $"+adminTokenEnv+")")
	return health, healthCA, token
}

// evictResult is what evict --json and drop --json print: the server's
// answer as one JSON object.
type evictResult struct {
	Result       string `json:"result"` // evicted, dropped
	Conversation uint64 `json:"conversation"`
	// Participant and Seq: evict's participant and the seq of its left
	// record.
	Participant *uint64 `json:"participant,omitempty"`
	Seq         uint64  `json:"seq,omitempty"`
	// Evicted: every participant drop evicted, with its left record's seq.
	Evicted []evicted `json:"evicted,omitempty"`
}

type evicted struct {
	Participant uint64 `json:"participant"`
	Seq         uint64 `json:"seq"`
}
