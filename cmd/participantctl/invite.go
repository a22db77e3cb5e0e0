package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/participant"
)

func init() {
	register(&command{
		name:     "invite",
		synopsis: "mint an invitation to enroll into a conversation (offline)",
		usage: `--conversation C [--expires DURATION] [--data DIR]

Mints an invitation to conversation C, valid for DURATION (default 24h),
and prints it on stdout in its text form (base64url), for a server run with
--enroll-policy invite: an enroll into C must carry it (the Go client:
client.WithInvite). It is an HMAC under the data directory's node.key, so
it is minted where that key is, and needs no running server; it reads the
key and writes nothing. Anyone holding the invitation may enroll into C,
any number of times, until it expires.`,
		run: runInvite,
	})
}

func runInvite(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["invite"])
	dir := fs.String("data", "./data", "the server's data directory (its node.key)")
	conv := fs.Uint64("conversation", 0, "the conversation the invitation admits to (required)")
	expires := fs.Duration("expires", 24*time.Hour, "how long the invitation is valid")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !fsHasFlag(fs, "conversation") {
		return &exitError{exitUsage, errors.New("--conversation is required")}
	}
	if *expires <= 0 {
		return &exitError{exitUsage, errors.New("--expires must be positive")}
	}
	key, err := readNodeKey(*dir)
	if err != nil {
		return err
	}
	now := time.Now()
	until := now.Add(*expires)
	inv, err := participant.MintInvite(key, participant.ConversationID(*conv), now, until)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, participant.InviteText(inv))
	fmt.Fprintf(e.stderr, "invitation to conversation %d, valid until %s\n", *conv, until.UTC().Format(time.RFC3339))
	return nil
}

// readNodeKey reads dir's node key without ever creating one: an
// invitation under a key the server does not have would admit nobody.
func readNodeKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, participant.NodeKeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no %s in %s: start participantd on this data directory once to create it", participant.NodeKeyFile, dir)
	}
	if err != nil {
		return nil, err
	}
	if len(key) != participant.NodeKeySize {
		return nil, fmt.Errorf("%s has %d bytes, want %d", path, len(key), participant.NodeKeySize)
	}
	return key, nil
}
