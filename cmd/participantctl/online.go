package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/internal/cli"
)

// The one-shot subcommands. tell and ack need the participant's binding,
// which belongs to a connection, so each first attaches on its own
// connection (minting a new generation, saved to the credential file) and
// ends its binding cleanly when it exits.

func init() {
	register(&command{
		name:     "enroll",
		synopsis: "enroll a new participant in a conversation and save its credential",
		usage: `--conversation N --creds FILE [--force] [--invite TEXT] [--json]

Enrolls a new participant in conversation N (creating the conversation on
first use) and writes its credential to FILE (mode 0600). The enroll's token
is saved in FILE before it is sent: if the command dies before the answer,
re-running it recovers the same participant. Refuses to overwrite an
existing FILE unless --force: the credential it holds would be lost. A
server run with --enroll-policy invite needs --invite, the text
participantctl invite printed. The binding ends (detached/clean) when the
command exits.`,
		run: runEnroll,
	})
	register(&command{
		name:     "attach",
		synopsis: "attach with the saved credential, minting a new generation",
		usage: `--creds FILE [--json]

Attaches the participant of FILE, which mints a new generation and secret;
FILE is rewritten with them. The attach's token is saved in FILE before it
is sent, so that a run that dies before the answer does not lock the
participant out: the next command replays that attach first. The binding ends (detached/clean) when the
command exits.`,
		run: runAttach,
	})
	register(&command{
		name:     "tell",
		synopsis: "send a record to the conversation (attaches first)",
		usage: `--creds FILE [--token HEX] [--json] MESSAGE|-

Sends MESSAGE (or standard input, for -) as a record. A tell needs the
participant's binding, which belongs to a connection, so tell first attaches
on its own connection: that mints a new generation (FILE is rewritten) and
supersedes any binding the participant holds elsewhere, e.g. a running tail.
Prints "told: conversation C participant P seq S".

Standard input is sent byte for byte: "echo hi | participantctl tell ... -"
sends "hi\n", which tail prints as the text hi and tail --json exactly.

--token names the operation: re-running with the token printed by a tell
whose outcome was unknown (in_doubt) answers the original seq instead of
sending twice.`,
		run: runTell,
	})
	register(&command{
		name:     "ack",
		synopsis: "acknowledge deliveries through a seq (attaches first)",
		usage: `--creds FILE --through N [--json]

Acknowledges every record through seq N. An ack needs the binding, so ack
first attaches on its own connection, like tell (a new generation; FILE is
rewritten; a binding elsewhere is superseded). Prints
"acked: conversation C participant P cursor N", N the durable cursor.`,
		run: runAck,
	})
	register(&command{
		name:     "leave",
		synopsis: "retire the participant for good",
		usage: `--creds FILE [--json]

Retires the participant. A detached participant leaves from any connection;
one bound elsewhere (a running tail) is first attached here, which ends that
binding.`,
		run: runLeave,
	})
}

func runEnroll(ctx context.Context, e *env, args []string) error {
	c := commands["enroll"]
	fs := newFlagSet(e, c)
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	conv := fs.Uint64("conversation", 0, "the conversation to enroll in")
	force := fs.Bool("force", false, "overwrite an existing credential file")
	inviteText := fs.String("invite", "", "the invitation participantctl invite printed (servers with --enroll-policy invite)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	var opts []client.CallOption
	if *inviteText != "" {
		inv, err := client.ParseInvite(*inviteText)
		if err != nil {
			return &cli.ExitError{Code: cli.ExitUsage, Err: err}
		}
		opts = append(opts, client.WithInvite(inv))
	}
	if cf.creds == "" {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--creds is required")}
	}
	if !fsHasFlag(fs, "conversation") {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--conversation is required")}
	}
	// A file holding only a pending enroll is an earlier run's enroll
	// whose answer was not saved: retry it with its token, so that the
	// server replays the participant it created instead of making another.
	replaying := false
	if f, err := readCredsFile(cf.creds); err == nil && f.pending != nil && f.pending.op == client.IntentEnroll && !*force {
		if f.cred.Conversation != *conv {
			return fmt.Errorf("%s holds a pending enroll in conversation %d, not %d; use --force to overwrite", cf.creds, f.cred.Conversation, *conv)
		}
		opts = append(opts, client.WithToken(f.pending.token))
		replaying = true
	} else if _, err := os.Stat(cf.creds); err == nil && !*force {
		return fmt.Errorf("%s exists: it may hold a credential; use --force to overwrite", cf.creds)
	}
	octx, cancel := cf.opContext(ctx)
	defer cancel()
	s, err := cf.dial(octx, e, true)
	if err != nil {
		return err
	}
	defer s.Close()
	cred, err := s.Enroll(octx, *conv, opts...)
	if err != nil && replaying && (errors.Is(err, client.ErrReceiptExpired) || errors.Is(err, client.ErrTokenExpired) || errors.Is(err, client.ErrTokenInvalid)) {
		return fmt.Errorf("%w\nthe enroll saved in %s may have created a participant whose answer the server no longer replays; use --force to enroll anew", err, cf.creds)
	}
	if err != nil {
		return err
	}
	if err := s.saved(); err != nil {
		return err
	}
	s.finish(cred)
	return printResult(e, *asJSON, fmt.Sprintf("enrolled: %v", cred), result{Result: "enrolled",
		Conversation: cred.Conversation, Participant: cred.Participant, Generation: cred.Generation})
}

func runAttach(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["attach"])
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	s, cred, err := cf.attached(ctx, e, true)
	if err != nil {
		return err
	}
	defer s.Close()
	s.finish(cred)
	return printResult(e, *asJSON, fmt.Sprintf("attached: %v", cred), result{Result: "attached",
		Conversation: cred.Conversation, Participant: cred.Participant, Generation: cred.Generation})
}

func runTell(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["tell"])
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	tokenHex := fs.String("token", "", "the operation's token, 32 hex digits, to learn the outcome of an earlier tell (default: a fresh UUIDv7, which a server with a token window requires)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("want exactly one MESSAGE, or - for standard input")}
	}
	var payload []byte
	if m := fs.Arg(0); m == "-" {
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return fmt.Errorf("read standard input: %w", err)
		}
		payload = b
	} else {
		payload = []byte(m)
	}
	tok := client.NewToken()
	if *tokenHex != "" {
		t, err := client.ParseToken(*tokenHex)
		if err != nil {
			return &cli.ExitError{Code: cli.ExitUsage, Err: err}
		}
		tok = t
	}
	s, cred, err := cf.attached(ctx, e, true)
	if err != nil {
		return err
	}
	defer s.Close()
	octx, cancel := cf.opContext(ctx)
	defer cancel()
	seq, err := s.Tell(octx, cred, payload, client.WithToken(tok))
	if err != nil {
		return explain(inDoubtHint(err), about{cred: cred, creds: cf.creds, size: len(payload)})
	}
	s.finish(cred)
	return printResult(e, *asJSON, fmt.Sprintf("told: conversation %d participant %d seq %d", cred.Conversation, cred.Participant, seq),
		result{Result: "told", Conversation: cred.Conversation, Participant: cred.Participant, Seq: &seq})
}

func runAck(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["ack"])
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	through := fs.Uint64("through", 0, "acknowledge every record through this seq")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if !fsHasFlag(fs, "through") {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--through is required")}
	}
	s, cred, err := cf.attached(ctx, e, true)
	if err != nil {
		return err
	}
	defer s.Close()
	octx, cancel := cf.opContext(ctx)
	defer cancel()
	cursor, err := s.Ack(octx, cred, *through)
	if err != nil {
		return explain(err, about{cred: cred, creds: cf.creds, seq: *through})
	}
	s.finish(cred)
	return printResult(e, *asJSON, fmt.Sprintf("acked: conversation %d participant %d cursor %d", cred.Conversation, cred.Participant, cursor),
		result{Result: "acked", Conversation: cred.Conversation, Participant: cred.Participant, Cursor: &cursor})
}

func runLeave(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["leave"])
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print the result as one JSON object")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	f, err := readCredsFile(cf.creds)
	if err != nil {
		return err
	}
	cred, err := readCreds(cf.creds)
	if err != nil {
		return err
	}
	octx, cancel := cf.opContext(ctx)
	defer cancel()
	s, err := cf.dial(octx, e, true)
	if err != nil {
		return err
	}
	defer s.Close()
	if f.pending != nil {
		// An attach of an earlier run may have minted a newer generation:
		// recover it first, or the leave presents a stale one.
		if cred, err = s.attachSaved(octx, cred); err != nil {
			return err
		}
	}
	seq, err := s.Leave(octx, cred)
	if errors.Is(err, client.ErrNoBinding) {
		// Bound on another connection: only that binding's connection
		// may leave, so take the binding first.
		if cred, err = s.attachSaved(octx, cred); err == nil {
			seq, err = s.Leave(octx, cred)
		}
	}
	if err != nil {
		return explain(err, about{cred: cred, creds: cf.creds})
	}
	return printResult(e, *asJSON, fmt.Sprintf("left: conversation %d participant %d seq %d", cred.Conversation, cred.Participant, seq),
		result{Result: "left", Conversation: cred.Conversation, Participant: cred.Participant, Seq: &seq})
}

// result is what --json prints of a one-shot command: the answer's name
// and its fields. The secret stays in the credential file.
type result struct {
	Result       string  `json:"result"`
	Conversation uint64  `json:"conversation"`
	Participant  uint64  `json:"participant"`
	Generation   uint64  `json:"generation,omitempty"`
	Seq          *uint64 `json:"seq,omitempty"`
	Cursor       *uint64 `json:"cursor,omitempty"`
}

// printResult prints line, or with asJSON r as one JSON object, and a
// newline: every command's --json output goes through it.
func printResult(e *env, asJSON bool, line string, r any) error {
	if !asJSON {
		_, err := fmt.Fprintln(e.stdout, line)
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(e.stdout, "%s\n", b)
	return err
}

// inDoubtHint adds the token to an in_doubt error, so the user can learn
// the outcome.
func inDoubtHint(err error) error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Code == client.CodeInDoubt && !ce.Token.IsZero() {
		return fmt.Errorf("%w\nthe outcome is unknown; re-run with --token %v to learn it without applying it twice", err, ce.Token)
	}
	return err
}

func fsHasFlag(fs *pflag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *pflag.Flag) {
		if f.Name == name {
			found = true
		}
	})
	return found
}
