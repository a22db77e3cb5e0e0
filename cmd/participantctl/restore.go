package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/vfs"
)

func init() {
	register(&command{
		name:     "restore",
		synopsis: "restore a backup into an empty data directory, then verify it (offline)",
		usage: `--from FILE --node-key FILE --data DIR [--json]
       --from FILE --etcd-endpoints URLS [--etcd-prefix P] [--json]

Checks the backup (participantctl backup) first, reading every page and
key of it, and the node key it belongs to: from a file that is not a whole
participantd data file nothing is written. Then copies both into DIR, which
must be absent or empty, durably (each file fsync'd, renamed, and the
directory fsync'd), and reconciles the restored data in dry run as verify
does. Exits 1 when verify refuses a conversation; the restored data
is left in place for inspection either way. Start participantd on DIR to
serve it: bindings of the backup's time end as died/unclean_restart. It
refuses the data file of a data directory whose write-ahead log holds
records after it (a crash left them there): take backup --data first.

With --etcd-endpoints it restores a cluster backup (backup against a
cluster node) into the etcd prefix P (TLS and auth: the --etcd-* flags of
participantd), which must hold no key but, optionally, its node key
(secret/node-key, kept when the prefix was wiped): a backup carrying
another node key is then refused, nothing written, unless
--replace-node-key (it would void every credential and invitation of the
key held). The whole file is checked first
(count, SHA-256 and every value's checksum): nothing is written from a
damaged file. A backup taken before etcd checksums restores as it is,
and is then converted with convert-etcd. The keys are
written in transactions within etcd's limits, each creating its keys only
where absent; while it runs, P/restoring exists and no node starts on P
(a cut restore leaves it: delete the prefix and restore again). Ownerships
and live-node keys are not in a backup: the restored conversations have no
owner, and the first node to touch one claims and reconciles it. The
restored prefix is then verified as verify --etcd-endpoints does. A
single-node backup cannot be restored into etcd, nor a cluster backup
into a data directory.

With --json it prints JSON lines: first the restore's object (result
"restored", from; data and bytes, or a cluster backup's prefix, keys,
txns, backup_prefix and revision), then verify --json's object per
conversation.`,
		run: runRestore,
	})
}

// restoreFS is the file system restore creates the data directory on;
// tests record its directory syncs.
var restoreFS = vfs.OS

func runRestore(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["restore"])
	from := fs.String("from", "", "the backup file")
	keyFile := fs.String("node-key", "", "the node key (node.key) of the server the backup comes from")
	dir := fs.String("data", "", "the data directory to restore into (absent or empty)")
	replaceKey := fs.Bool("replace-node-key", false, "cluster backups: let the backup's node key replace a different one the prefix holds")
	etcd := addEtcdFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON lines: the restore's object, then verify --json's per conversation")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if etcd.set() {
		if *keyFile != "" || *dir != "" {
			return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--etcd-endpoints restores a cluster backup, which holds the cluster secret: no --node-key or --data")}
		}
		if *from == "" {
			return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--from is required")}
		}
		return restoreCluster(ctx, e, *from, etcd, *replaceKey, *asJSON)
	}
	if *replaceKey {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--replace-node-key restores a cluster backup: it needs --etcd-endpoints")}
	}
	if *from == "" || *keyFile == "" || *dir == "" {
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--from, --node-key and --data are required")}
	}
	if entries, err := os.ReadDir(*dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty: restore only into an empty data directory", *dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := checkNoPendingLog(*from); err != nil {
		return err
	}
	src, err := os.Open(*from)
	if err != nil {
		return err
	}
	defer src.Close()
	if isClusterBackup(src) {
		return fmt.Errorf("%s is a cluster backup: restore it into etcd with --etcd-endpoints (converting it to a data directory is not supported)", *from)
	}
	if err := checkBackup(*from); err != nil {
		return err
	}
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		return err
	}
	if len(key) != participant.NodeKeySize {
		return fmt.Errorf("%s has %d bytes, a node key has %d", *keyFile, len(key), participant.NodeKeySize)
	}
	// The data directory's entry, and each new parent's, durable before
	// the files in it: a crash that lost it would lose the restore.
	if err := vfs.MkdirAll(restoreFS, *dir); err != nil {
		return err
	}
	if _, err := writeDurably(filepath.Join(*dir, participant.NodeKeyFile), bytes.NewReader(key), int64(len(key))); err != nil {
		return fmt.Errorf("restore node key: %w", err)
	}
	n, err := writeDurably(filepath.Join(*dir, storeFile), src, -1)
	if err != nil {
		return fmt.Errorf("restore data: %w", err)
	}
	// The marker names the backup and its time, for the server to say so
	// when it refuses a credential newer than the data (server.RestoredFile).
	marker := restoreMarker(*from, src, time.Now())
	if _, err := writeDurably(filepath.Join(*dir, server.RestoredFile), strings.NewReader(marker), int64(len(marker))); err != nil {
		return fmt.Errorf("restore marker: %w", err)
	}
	if err := printRestore(e, *asJSON, fmt.Sprintf("restored %d bytes into %s; verifying", n, *dir),
		restoreResult{From: *from, Data: *dir, Bytes: n}); err != nil {
		return err
	}
	return runVerify(ctx, e, verifyArgs(*asJSON, "--data", *dir))
}

// printRestore prints line, or with asJSON r (its result set) as one JSON
// object, and a newline.
func printRestore(e *env, asJSON bool, line string, r restoreResult) error {
	r.Result = "restored"
	return printResult(e, asJSON, line, r)
}

// verifyArgs is args for the verify that follows a restore, with --json
// when the restore's output is JSON.
func verifyArgs(asJSON bool, args ...string) []string {
	if asJSON {
		return append(args, "--json")
	}
	return args
}

// checkNoPendingLog refuses from when it is the data file of a data
// directory whose log holds records after it (offline.Pending): the file
// is the whole store only with its log, and after a crash the records
// after its checkpoint are in the log alone.
func checkNoPendingLog(from string) error {
	if filepath.Base(from) != storeFile {
		return nil // not a data directory's file
	}
	dir := filepath.Dir(from)
	n, err := offline.Pending(dir, offlineOptions)
	switch {
	case err != nil:
		return fmt.Errorf("%s is in a data directory whose log cannot be read: %w", from, explainOpen(dir, err))
	case n > 0:
		return fmt.Errorf("%s is the data file of a data directory whose log holds %d records after it, which the file alone would lose: copy the directory with backup --data %s (a stopped server) or backup (a running one), and restore that",
			from, n, dir)
	}
	return nil
}

// checkBackup reads the whole backup file at path (offline.CheckFile:
// every page reachable from its meta page, every key and value in this
// store's layout) before restore writes anything, and explains a file it refuses
// in terms of the file given: it is the backup that is wrong, not a data
// directory. The caller has opened path, so it exists and is readable.
func checkBackup(path string) error {
	err := offline.CheckFile(path, offlineOptions)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrLocked):
		return fmt.Errorf("%s is in use by a running server: take a backup of it with participantctl backup, and restore that: %w", path, err)
	}
	// The caller opened the file, so what fails here is its content:
	// empty, damaged (store.ErrCorrupt), or not this store's layout.
	return fmt.Errorf("%s is not a whole participantd backup, so nothing was restored (it is empty, damaged or another kind of file; participantctl backup makes one): %w", path, err)
}

// isClusterBackup reports whether f starts with the cluster backup magic,
// and rewinds it.
func isClusterBackup(f *os.File) bool {
	defer f.Seek(0, io.SeekStart)
	magic := make([]byte, len(backup.Magic))
	_, err := io.ReadFull(f, magic)
	return err == nil && string(magic) == backup.Magic
}

// restoreCluster restores the cluster backup from into the empty prefix of
// the etcd cluster of ef, then verifies the restored prefix.
func restoreCluster(ctx context.Context, e *env, from string, ef *etcdFlags, replaceKey, asJSON bool) error {
	cc := ef.config(e)
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	if !isClusterBackup(src) {
		return fmt.Errorf("%s is not a cluster backup (a single-node backup restores into a data directory with --data; converting it to etcd is not supported): %w", from, backup.ErrNotBackup)
	}
	cli, err := cc.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	sum, err := backup.Restore(ctx, cli.KV, cc.Prefix, src, backup.RestoreOptions{ReplaceNodeKey: replaceKey})
	if errors.Is(err, backup.ErrNodeKeyDiffers) {
		return fmt.Errorf("restore %s: %w; --replace-node-key replaces it", from, err)
	}
	if err != nil {
		return fmt.Errorf("restore %s: %w", from, err)
	}
	if err := printRestore(e, asJSON, fmt.Sprintf("restored %d keys (backup of %s at etcd revision %d) into %s in %d transactions; verifying",
		sum.Keys, sum.Header.Prefix, sum.Header.Revision, cc.Prefix, sum.Txns),
		restoreResult{From: from, Prefix: cc.Prefix, Keys: sum.Keys, Txns: sum.Txns, BackupPrefix: sum.Header.Prefix, Revision: sum.Header.Revision}); err != nil {
		return err
	}
	return runVerify(ctx, e, verifyArgs(asJSON, etcdArgs(cc)...))
}

// etcdArgs returns the flags that reach cc's prefix, for running verify
// after a command that wrote it.
func etcdArgs(cc server.ClusterConfig) []string {
	args := []string{"--etcd-endpoints", strings.Join(cc.Endpoints, ","), "--etcd-prefix", cc.Prefix}
	for _, f := range []struct{ name, v string }{{"etcd-ca", cc.CA}, {"etcd-cert", cc.Cert}, {"etcd-key", cc.Key}, {"etcd-username", cc.Username}, {"etcd-password", cc.Password}} {
		if f.v != "" {
			args = append(args, "--"+f.name, f.v)
		}
	}
	return args
}

// restoreMarker is the line of server.RestoredFile for a restore at now
// from the backup file from: its path and modification time (when the
// backup was written, unless it was copied since).
func restoreMarker(from string, f *os.File, now time.Time) string {
	if abs, err := filepath.Abs(from); err == nil {
		from = abs
	}
	written := "unknown"
	if fi, err := f.Stat(); err == nil {
		written = fi.ModTime().UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s, written %s, restored %s\n", from, written, now.UTC().Format(time.RFC3339))
}

// restoreResult is the first line restore --json prints; verify --json's
// line per conversation follows.
type restoreResult struct {
	Result string `json:"result"` // "restored"
	From   string `json:"from"`   // the backup file
	// Data and Bytes: the data directory restored into, and the data
	// file's size.
	Data  string `json:"data,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	// Prefix, Keys, Txns: a cluster backup's etcd prefix restored into,
	// the keys written and the transactions they took; BackupPrefix and
	// Revision say where and when the backup was read.
	Prefix       string `json:"prefix,omitempty"`
	Keys         int64  `json:"keys,omitempty"`
	Txns         int    `json:"txns,omitempty"`
	BackupPrefix string `json:"backup_prefix,omitempty"`
	Revision     int64  `json:"revision,omitempty"`
}
