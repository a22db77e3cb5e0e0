package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"

	"github.com/participantd/participantd/client"
)

func init() {
	register(&command{
		name:     "tail",
		synopsis: "follow the conversation's deliveries, acknowledging them",
		usage: `--creds FILE [--json] [--count N] [--no-ack]

Attaches the participant of FILE (a new generation; FILE is rewritten, and
again after every re-attachment following a reconnect) and prints every
delivery, one line each, acknowledging each after printing it:

  SEQ <tab> KIND <tab> PARTICIPANT <tab> CAUSE or - <tab> PAYLOAD

PAYLOAD is the text of a record when it is printable UTF-8, else "hex:"
and its bytes in hex. --json prints one JSON object per line instead. tail
keeps its connection and binding until interrupted or --count deliveries.`,
		run: runTail,
	})
}

func runTail(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["tail"])
	cf := addConnFlags(fs, e)
	asJSON := fs.Bool("json", false, "print one JSON object per delivery")
	count := fs.Int("count", 0, "stop after this many deliveries (0: follow until interrupted)")
	noAck := fs.Bool("no-ack", false, "do not acknowledge deliveries")
	if err := parse(fs, args); err != nil {
		return err
	}
	s, cred, err := cf.attached(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.Close()
	n := 0
	for {
		var d client.Delivery
		select {
		case <-ctx.Done():
			return nil
		case d = <-s.Deliveries():
		}
		if err := printDelivery(e.stdout, d, *asJSON); err != nil {
			return err
		}
		if !*noAck && d.Recipient == cred.Participant {
			octx, cancel := cf.opContext(ctx)
			_, err := s.Ack(octx, cred, d.Seq)
			cancel()
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("ack %d: %w", d.Seq, err)
			}
		}
		if n++; *count > 0 && n >= *count {
			return s.saved()
		}
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
	cause := string(d.Cause)
	if cause == "" {
		cause = "-"
	}
	if !printable {
		text = "hex:" + hex.EncodeToString(d.Payload)
	}
	_, err := fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\n", d.Seq, d.Kind, d.Participant, cause, text)
	return err
}

// payloadText returns p as text when it is valid UTF-8 of printable
// characters and spaces (no tabs or newlines, which would break the line).
func payloadText(p []byte) (string, bool) {
	if !utf8.Valid(p) {
		return "", false
	}
	s := string(p)
	for _, r := range s {
		if !unicode.IsPrint(r) && r != ' ' {
			return "", false
		}
	}
	return s, true
}
