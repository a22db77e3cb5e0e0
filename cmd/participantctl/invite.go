package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
)

func init() {
	register(&command{
		name:     "invite",
		synopsis: "mint an invitation to enroll into a conversation (offline)",
		usage: `--conversation C [--expires DURATION] [--uses N] [--data DIR | --etcd-endpoints URLS [--etcd-prefix P]] [--json]

Mints an invitation to conversation C, valid for DURATION (default 24h),
and prints it on stdout in its text form (base64url), for a server run with
--enroll-policy invite: an enroll into C must carry it (the Go client:
client.WithInvite). It is an HMAC under the data directory's node.key, so
it is minted where that key is, and needs no running server; it reads the
key and writes nothing. Anyone holding the invitation may enroll into C
until it expires: any number of times, or with --uses N at most N times
(the server counts the enrolls it admitted in C's history; a retry of
one with the same token replays it and spends nothing).

With --etcd-endpoints it mints under the cluster secret (secret/node-key
in the etcd prefix P), read with the operator's etcd credentials (the
--etcd-* flags of participantd): one read, nothing written, and no key is
ever created there.

With --json it prints one JSON object instead: invite (the text form),
conversation, valid_until (RFC 3339, UTC) and uses (0: any number).`,
		run: runInvite,
	})
}

func runInvite(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["invite"])
	dir := fs.String("data", "./data", "the server's data directory (its node.key)")
	conv := fs.Uint64("conversation", 0, "the conversation the invitation admits to (required)")
	expires := fs.Duration("expires", 24*time.Hour, "how long the invitation is valid")
	uses := fs.Uint("uses", 0, "how many enrolls the invitation admits (0: any number)")
	etcd := addEtcdFlags(fs)
	asJSON := fs.Bool("json", false, "print the invitation and what it admits as one JSON object")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if etcd.set() && fsHasFlag(fs, "data") {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--data and --etcd-endpoints: the key is either in a data directory or in etcd")}
	}
	if !fsHasFlag(fs, "conversation") {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--conversation is required")}
	}
	if *expires <= 0 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--expires must be positive")}
	}
	if *uses > 1<<32-1 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--uses must fit 32 bits")}
	}
	var key []byte
	var err error
	if etcd.set() {
		key, err = readClusterNodeKey(ctx, etcd.config(e))
	} else {
		key, err = readNodeKey(*dir)
	}
	if err != nil {
		return err
	}
	now := time.Now()
	until := now.Add(*expires)
	inv, err := participant.MintInviteUses(key, participant.ConversationID(*conv), now, until, uint32(*uses))
	if err != nil {
		return err
	}
	if *asJSON {
		b, err := json.Marshal(inviteResult{Invite: participant.InviteText(inv), Conversation: *conv,
			ValidUntil: until.UTC().Format(time.RFC3339), Uses: *uses})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		return err
	}
	fmt.Fprintln(e.stdout, participant.InviteText(inv))
	admits := "any number of enrolls"
	if *uses > 0 {
		admits = fmt.Sprintf("at most %d enrolls", *uses)
	}
	fmt.Fprintf(e.stderr, "invitation to conversation %d, valid until %s, for %s\n", *conv, until.UTC().Format(time.RFC3339), admits)
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

// readClusterNodeKey reads the cluster secret of cc's prefix, never
// creating one (as readNodeKey).
func readClusterNodeKey(ctx context.Context, cc server.ClusterConfig) ([]byte, error) {
	cli, err := cc.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	k := cc.Prefix + backup.NodeKeyKey
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("no %s in etcd: start a participantd node on prefix %s once to create it", k, cc.Prefix)
	}
	var seal []byte
	if cc.SealKeyFile != "" {
		if seal, err = cluster.LoadSealKey(cc.SealKeyFile); err != nil {
			return nil, err
		}
	}
	stored, err := cluster.UnsealRel(backup.NodeKeyKey, resp.Kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k, err)
	}
	key, err := cluster.OpenNodeKey(seal, stored)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k, err)
	}
	return key, nil
}

// inviteResult is what invite --json prints.
type inviteResult struct {
	Invite       string `json:"invite"` // the text form, for --invite and client.ParseInvite
	Conversation uint64 `json:"conversation"`
	ValidUntil   string `json:"valid_until"` // RFC 3339, UTC
	Uses         uint   `json:"uses"`        // enrolls it admits; 0: any number
}
