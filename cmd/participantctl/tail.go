package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/wire"
)

// Exit statuses of tail besides 0, 1 and 2.
const (
	exitSuperseded = 3 // another session attached the participant
	exitRetired    = 4 // the participant left
)

func init() {
	register(&command{
		name:     "tail",
		synopsis: "follow the conversation's deliveries, acknowledging them",
		usage: `--creds FILE [--json] [--records-only] [--count N] [--no-ack] [--follow-takeover]

Attaches the participant of FILE (a new generation; FILE is rewritten, and
again after every re-attachment following a reconnect) and prints every
delivery on standard output, one line each, acknowledging each after
printing it. Records and lifecycle events look different:

  [SEQ] pP: PAYLOAD               a record told by participant P
  [SEQ] * pP KIND (CAUSE)         participant P joined, attached, detached,
                                  died or left (CAUSE for detached and died)

PAYLOAD is the text of a record when it is printable UTF-8 (tabs allowed)
on one line, without its line ending ("\n" or "\r\n", as tell - of
"echo hi" sends), else "hex:" and its bytes in hex. --json prints one JSON
object per line instead, with the payload exact: "payload" (text, its line
ending included) or "payload_hex".
--records-only prints records only (events are still acknowledged).

What happens to the connection goes to standard error: the attach and its
generation, a lost connection, the reconnect and the re-attachment with its
new generation. In cluster mode (--addr with several nodes) tail follows
the conversation to its new owner by itself when its node dies, drains or
no longer owns it, and says so; deliveries resume there, each printed
once, in order. tail follows until interrupted, or until --count printed
lines.

The participant has one binding. When another session attaches it (another
tail, or a tell, ack or leave with the same FILE), tail says so and exits
with status 3; with --follow-takeover it re-reads FILE every
--check-interval until that session has saved its newer credential there
(up to --timeout), and takes the binding back, which ends the other
session's. Do not run two tails of one FILE with
--follow-takeover: they take it from each other in turn. tail exits with
status 4 when the participant has left.`,
		run: runTail,
	})
}

// tailErr is tail's standard error, written by the client's callbacks and
// the main loop alike.
type tailErr struct {
	mu sync.Mutex
	w  io.Writer
}

func (t *tailErr) say(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "participantctl tail: "+format+"\n", args...)
}

func runTail(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["tail"])
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print one JSON object per delivery")
	count := fs.Int("count", 0, "stop after printing this many lines: deliveries, or records with --records-only (0: follow until interrupted)")
	recordsOnly := fs.Bool("records-only", false, "print records only, not lifecycle events (both are acknowledged)")
	noAck := fs.Bool("no-ack", false, "do not acknowledge deliveries")
	follow := fs.Bool("follow-takeover", false, "when another session attaches the participant, take the binding back with FILE's credential instead of exiting")
	check := fs.Duration("check-interval", 2*time.Second, "how often to check that the binding is still this tail's")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *check <= 0 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--check-interval must be positive")}
	}
	out := &tailErr{w: e.stderr}
	lost := make(chan error, 1)
	var following atomic.Bool // set once the first attach is done
	mod := func(o *client.ClusterOptions) {
		o.BindingCheckInterval = *check
		o.OnDisconnect = func(err error) { out.say("connection lost (%v); reconnecting", err) }
		o.OnFollow = func(c client.Credential, why error) {
			if why != nil {
				out.say("%v; following conversation %d to its owner", why, c.Conversation)
			} else {
				out.say("participant %d of conversation %d is bound on its conversation's owner; following", c.Participant, c.Conversation)
			}
		}
		o.OnWait = func(conv uint64, why error) {
			out.say("waiting for the owner of conversation %d (%v)", conv, why)
		}
		o.OnReconnect = func(w client.Welcome) {
			out.say("reconnected to %s (%s)", w.Server, welcomeNote(w))
		}
		save := o.OnCredential
		o.OnCredential = func(c client.Credential) {
			save(c)
			if following.Load() {
				out.say("re-attached participant %d of conversation %d at generation %d", c.Participant, c.Conversation, c.Generation)
			}
		}
		o.OnLost = func(_ client.Credential, why error) {
			select {
			case lost <- why:
			default:
			}
		}
	}
	s, cred, err := cf.attached(ctx, e, false, mod)
	if err != nil {
		return err
	}
	defer s.Close()
	following.Store(true)
	out.say("attached participant %d of conversation %d at generation %d; following", cred.Participant, cred.Conversation, cred.Generation)
	n := 0
	for {
		var d client.Delivery
		select {
		case <-ctx.Done():
			s.finish(cred)
			return nil
		case why := <-lost:
			if cred, err = takeBack(ctx, e, cf, s, out, cred, why, *follow, *check); err != nil {
				return err
			}
			continue
		case d = <-s.Deliveries():
		}
		if d.Kind == client.KindCompacted {
			out.say("conversation %d: the records below seq %d are gone, some of them never delivered to participant %d "+
				"(the server released them unacknowledged, past its --max-unacked-age); continuing from seq %d",
				d.Conversation, d.First, d.Recipient, d.First)
			continue
		}
		shown := !*recordsOnly || d.Kind == wire.KindRecord
		if shown {
			if err := printDelivery(e.stdout, d, *asJSON); err != nil {
				return err
			}
		}
		if !*noAck && d.Credential.Generation != 0 {
			octx, cancel := cf.opContext(ctx)
			_, err := s.Ack(octx, d.Credential, d.Seq)
			cancel()
			switch {
			case errors.Is(err, client.ErrParticipantLost):
				// OnLost has the reason; the loop handles it.
			case err != nil && ctx.Err() == nil:
				return fmt.Errorf("ack %d: %w", d.Seq, explain(err, about{cred: d.Credential, creds: cf.creds, seq: d.Seq}))
			}
		}
		if shown {
			if n++; *count > 0 && n >= *count {
				s.finish(cred)
				return s.saved()
			}
		}
	}
}

// takeBack handles the loss of the participant (why, from OnLost): it
// exits, or with follow takes the binding back with the credential file's
// credential after a pause, and returns the new credential.
func takeBack(ctx context.Context, e *env, cf *connFlags, s *session, out *tailErr, cred client.Credential, why error, follow bool, pause time.Duration) (client.Credential, error) {
	p, conv := cred.Participant, cred.Conversation
	switch {
	case errors.Is(why, client.ErrRetired):
		return cred, &cli.ExitError{Code: exitRetired, Err: fmt.Errorf("participant %d has left conversation %d; nothing more to follow", p, conv)}
	case !errors.Is(why, client.ErrBindingSuperseded):
		return cred, &cli.ExitError{Code: 1, Err: fmt.Errorf("participant %d of conversation %d is lost: %w", p, conv, why)}
	case !follow:
		return cred, &cli.ExitError{Code: exitSuperseded, Err: fmt.Errorf("binding superseded: another session attached participant %d of conversation %d; exiting (--follow-takeover takes it back instead)", p, conv)}
	}
	out.say("binding superseded: another session attached participant %d of conversation %d; taking it back in %v", p, conv, pause)
	octx, cancel := cf.opContext(ctx)
	defer cancel()
	newer, err := savedAfter(octx, cf.creds, cred.Generation, pause)
	if ctx.Err() != nil {
		return cred, nil
	}
	if err != nil {
		return cred, fmt.Errorf("take the binding back: %w", err)
	}
	got, err := s.Attach(octx, newer)
	if err == nil {
		err = s.saved()
	}
	if err != nil {
		return cred, fmt.Errorf("take the binding back: %w", explain(err, about{cred: newer, creds: cf.creds}))
	}
	out.say("took participant %d of conversation %d back at generation %d", p, conv, got.Generation)
	return got, nil
}

// savedAfter waits until the credential file at path holds a generation
// past gen, re-reading it every pause: the session that superseded the
// binding rewrites the file only once its attach is answered, which can be
// after this tail learned of it. It gives up when ctx ends.
func savedAfter(ctx context.Context, path string, gen uint64, pause time.Duration) (client.Credential, error) {
	t := time.NewTimer(pause)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return client.Credential{}, fmt.Errorf("%s still holds generation %d, the one superseded: the session that attached the participant has not saved its credential there (%w)", path, gen, ctx.Err())
		case <-t.C:
		}
		cred, err := readCreds(path)
		if err != nil {
			return cred, err
		}
		if cred.Generation > gen {
			return cred, nil
		}
		t.Reset(pause)
	}
}

// deliveryJSON is tail --json's line.
type deliveryJSON struct {
	Conversation uint64 `json:"conversation"`
	Recipient    uint64 `json:"recipient"`
	Seq          uint64 `json:"seq"`
	Kind         string `json:"kind"`
	Participant  uint64 `json:"participant"`
	Cause        string `json:"cause,omitempty"`
	Payload      string `json:"payload,omitempty"`     // printable text
	PayloadHex   string `json:"payload_hex,omitempty"` // otherwise
}

func printDelivery(w io.Writer, d client.Delivery, asJSON bool) error {
	text, printable := payloadText(d.Payload)
	if asJSON {
		j := deliveryJSON{Conversation: d.Conversation, Recipient: d.Recipient, Seq: d.Seq,
			Kind: string(d.Kind), Participant: d.Participant, Cause: string(d.Cause)}
		if printable {
			j.Payload = text
		} else {
			j.PayloadHex = hex.EncodeToString(d.Payload)
		}
		b, err := json.Marshal(j)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	if d.Kind != wire.KindRecord {
		line := fmt.Sprintf("[%d] * p%d %s", d.Seq, d.Participant, d.Kind)
		if d.Cause != "" {
			line += " (" + string(d.Cause) + ")"
		}
		_, err := fmt.Fprintln(w, line)
		return err
	}
	if printable {
		// The line's own newline stands for the payload's line ending;
		// --json keeps the payload exact.
		text = trimLineEnding(text)
	} else {
		text = "hex:" + hex.EncodeToString(d.Payload)
	}
	_, err := fmt.Fprintf(w, "[%d] p%d: %s\n", d.Seq, d.Participant, text)
	return err
}

// payloadText returns p as text when it is valid UTF-8 of printable
// characters, spaces and tabs, ended by at most one line ending ("\n" or
// "\r\n"), which text piped into tell - usually has: a line of text is
// text. Any other control character, an inner newline included (it would
// break tail's one line per delivery), makes p binary.
func payloadText(p []byte) (string, bool) {
	if !utf8.Valid(p) {
		return "", false
	}
	s := string(p)
	body := trimLineEnding(s)
	for _, r := range body {
		if !unicode.IsPrint(r) && r != ' ' && r != '\t' {
			return "", false
		}
	}
	return s, true
}

// trimLineEnding returns s without one trailing "\n" or "\r\n".
func trimLineEnding(s string) string {
	s, ok := strings.CutSuffix(s, "\n")
	if ok {
		s = strings.TrimSuffix(s, "\r")
	}
	return s
}

// welcomeNote describes what the server announced for a reconnect line:
// its incarnation, the connection, and its token window when it runs one.
func welcomeNote(w client.Welcome) string {
	note := fmt.Sprintf("server incarnation %d, connection %d", w.Incarnation, w.Connection)
	if w.TokenWindow > 0 {
		note += fmt.Sprintf(", token window %v, token skew %v", w.TokenWindow, w.TokenSkew)
	}
	return note
}
