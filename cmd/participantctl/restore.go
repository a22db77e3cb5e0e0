package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/participantd/participantd/participant"
)

func init() {
	register(&command{
		name:     "restore",
		synopsis: "restore a backup into an empty data directory, then verify it (offline)",
		usage: `--from FILE --node-key FILE --data DIR

Copies a backup (participantctl backup) and the node key it belongs to into
DIR, which must be absent or empty, durably (each file fsync'd, renamed,
and the directory fsync'd), then reconciles the restored data in dry run as
verify does. Exits 1 when verify refuses a conversation; the restored data
is left in place for inspection either way. Start participantd on DIR to
serve it: bindings of the backup's time end as died/unclean_restart.`,
		run: runRestore,
	})
}

func runRestore(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["restore"])
	from := fs.String("from", "", "the backup file")
	keyFile := fs.String("node-key", "", "the node key (node.key) of the server the backup comes from")
	dir := fs.String("data", "", "the data directory to restore into (absent or empty)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *from == "" || *keyFile == "" || *dir == "" {
		return &exitError{code: 2, err: errors.New("--from, --node-key and --data are required")}
	}
	if entries, err := os.ReadDir(*dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty: restore only into an empty data directory", *dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		return err
	}
	if len(key) != participant.NodeKeySize {
		return fmt.Errorf("%s has %d bytes, a node key has %d", *keyFile, len(key), participant.NodeKeySize)
	}
	src, err := os.Open(*from)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	if _, err := writeDurably(filepath.Join(*dir, participant.NodeKeyFile), bytes.NewReader(key), int64(len(key))); err != nil {
		return fmt.Errorf("restore node key: %w", err)
	}
	n, err := writeDurably(filepath.Join(*dir, storeFile), src, -1)
	if err != nil {
		return fmt.Errorf("restore data: %w", err)
	}
	fmt.Fprintf(e.stdout, "restored %d bytes into %s; verifying\n", n, *dir)
	return runVerify(ctx, e, []string{"--data", *dir})
}
