package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/server"
)

// adminTokenEnv names the environment variable that gives --admin-token,
// so that the token need not appear in a process listing.
const adminTokenEnv = "PARTICIPANTCTL_ADMIN_TOKEN"

func init() {
	register(&command{
		name:     "backup",
		synopsis: "copy a running server's data, consistently, to a file (online)",
		usage: `--out FILE [--health ADDR|URL] [--health-ca FILE] [--admin-token TOKEN] [--json]
       --out FILE --data DIR [--json]

Asks the running server's health listener (POST /admin/backup; the server
needs --admin-token) for a consistent copy of its data file: every answered
operation is in it, and the server keeps serving while it streams. The copy
is written to FILE.partial, checked against the announced size, fsync'd,
and renamed to FILE, so FILE is either whole or absent. The token comes
from --admin-token or ` + adminTokenEnv + `.

A health listener served over HTTPS (participantd --health-tls-cert) is
reached with --health https://HOST:PORT, or with --health-ca FILE (the PEM
CA that signed its certificate; it implies https).

The copy does not hold the node key (node.key in the data directory): it
never changes; back it up once, apart, and give it to restore.

With --data it copies a STOPPED server's data directory instead (offline):
the write-ahead log is first replayed into the data file, as participantd's
start does, so the copy holds every record the log held. After a crash or
a kill the data file alone does not: never copy it by hand.

Against a node of a cluster (participantd --etcd-endpoints), the copy is a
cluster backup of the whole data set under the etcd prefix, read at one
etcd revision (any node serves it): a versioned file whose trailer carries
the key count and a SHA-256, checked before FILE appears. It holds the
cluster secret; ownerships and live-node keys are left out. Restore it with
restore --etcd-endpoints, verify it with verify --from.

With --json the result is one JSON object: result ("backup"), kind
(server, cluster or offline), file, bytes and sha256 (of the file, to
check a copy of it later); data (offline); prefix, revision and keys (a
cluster backup).`,
		run: runBackup,
	})
}

func runBackup(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, commands["backup"])
	out := fs.String("out", "", "the file to write the copy to (must not exist)")
	health := fs.String("health", server.DefaultHealthListen, "the server's health listener: host:port, or a URL http://host:port or https://host:port")
	healthCA := fs.String("health-ca", "", "PEM CA verifying the health listener's certificate (implies https)")
	token := fs.String("admin-token", "", "the server's admin token (default $"+adminTokenEnv+")")
	data := fs.String("data", "", "copy this stopped server's data directory instead of asking a running server")
	asJSON := fs.Bool("json", false, "print the result as one JSON object (kind, file, bytes, sha256; a cluster backup's prefix, revision and keys)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *data != "" {
		if *out == "" {
			return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--out is required")}
		}
		return backupOffline(e, *data, *out, *asJSON)
	}
	if *token == "" {
		*token = e.getenv(adminTokenEnv)
	}
	switch {
	case *out == "":
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("--out is required")}
	case *token == "":
		return &cli.ExitError{Code: cli.ExitUsage, Err: errors.New("an admin token is required (--admin-token or " + adminTokenEnv + ")")}
	}
	if _, err := os.Stat(*out); err == nil {
		return fmt.Errorf("%s exists; backup never overwrites", *out)
	}
	base, hc, err := healthClient(*health, *healthCA)
	if err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/admin/backup", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+*token)
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("backup: the server answered %s: %s", resp.Status, msg)
	}
	sum := sha256.New()
	body := io.TeeReader(resp.Body, sum)
	if resp.Header.Get("Content-Type") == server.ClusterBackupContentType {
		// A cluster backup streams without a size: its trailer (count and
		// checksum) is what says it is whole, checked before the rename.
		var h backup.Header
		n, err := writeDurablyChecked(*out, body, -1, func(f *os.File) (err error) {
			h, err = backup.Check(f)
			return err
		})
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		return printBackup(e, *asJSON, fmt.Sprintf("cluster backup of %d bytes written to %s: %d keys of %s at etcd revision %d", n, *out, h.Keys, h.Prefix, h.Revision),
			backupResult{Kind: "cluster", File: *out, Bytes: n, SHA256: hex.EncodeToString(sum.Sum(nil)), Prefix: h.Prefix, Revision: h.Revision, Keys: h.Keys})
	}
	if resp.ContentLength < 0 {
		return errors.New("backup: the server announced no size")
	}
	n, err := writeDurably(*out, body, resp.ContentLength)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return printBackup(e, *asJSON, fmt.Sprintf("backup of %d bytes written to %s", n, *out),
		backupResult{Kind: "server", File: *out, Bytes: n, SHA256: hex.EncodeToString(sum.Sum(nil))})
}

// printBackup prints line, or with asJSON r (its result set) as one JSON
// object, and a newline.
func printBackup(e *env, asJSON bool, line string, r backupResult) error {
	r.Result = "backup"
	return printResult(e, asJSON, line, r)
}

// healthClient returns the base URL of the health listener at health
// (host:port, or an http:// or https:// URL) and the client to reach it
// with: over HTTPS when the URL says so or ca (a PEM file of the CAs that
// verify the listener's certificate) is set.
func healthClient(health, ca string) (string, *http.Client, error) {
	base := health
	if !strings.Contains(base, "://") {
		base = "http://" + base
		if ca != "" {
			base = "https://" + health
		}
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", nil, fmt.Errorf("--health %q: want host:port or http(s)://host:port", health)
	}
	if ca == "" {
		return strings.TrimSuffix(base, "/"), http.DefaultClient, nil
	}
	if u.Scheme != "https" {
		return "", nil, fmt.Errorf("--health-ca with --health %q: the CA verifies https only", health)
	}
	pool, err := readCAs("health-ca", ca)
	if err != nil {
		return "", nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return strings.TrimSuffix(base, "/"), &http.Client{Transport: tr}, nil
}

// backupOffline writes a backup of the stopped server's data directory dir
// to out (offline.Backup), as durably as an online one, and prints what it
// wrote (with asJSON, as one JSON object).
func backupOffline(e *env, dir, out string, asJSON bool) error {
	if _, err := os.Stat(out); err == nil {
		return fmt.Errorf("%s exists; backup never overwrites", out)
	}
	pr, pw := io.Pipe()
	size := int64(-1)
	go func() {
		_, err := offline.Backup(dir, offlineOptions, pw, func(n int64) { size = n })
		pw.CloseWithError(explainOpen(dir, err))
	}()
	sum := sha256.New()
	n, err := writeDurablyChecked(out, io.TeeReader(pr, sum), -1, func(f *os.File) error {
		// The pipe is drained, so the copy ended and announced its size.
		fi, err := f.Stat()
		if err == nil && fi.Size() != size {
			err = fmt.Errorf("got %d bytes, want %d", fi.Size(), size)
		}
		return err
	})
	pr.Close()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return printBackup(e, asJSON, fmt.Sprintf("backup of %d bytes of %s written to %s", n, dir, out),
		backupResult{Kind: "offline", File: out, Bytes: n, SHA256: hex.EncodeToString(sum.Sum(nil)), Data: dir})
}

// writeDurably copies r to path through path.partial: it checks that
// exactly want bytes came (want < 0: any), fsyncs the file, renames it and
// fsyncs the directory, so path is either whole or absent. The partial
// file is removed on failure.
func writeDurably(path string, r io.Reader, want int64) (n int64, err error) {
	return writeDurablyChecked(path, r, want, nil)
}

// writeDurablyChecked is writeDurably that also runs check, when set, on
// the synced partial file (read from its start) before the rename: a file
// check refuses is removed and never renamed.
func writeDurablyChecked(path string, r io.Reader, want int64, check func(*os.File) error) (n int64, err error) {
	tmp := path + ".partial"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if n, err = io.Copy(f, r); err != nil {
		return n, fmt.Errorf("copy cut after %d bytes: %w", n, err)
	}
	if want >= 0 && n != want {
		return n, fmt.Errorf("got %d bytes, want %d", n, want)
	}
	if err = f.Sync(); err != nil {
		return n, err
	}
	if check != nil {
		r, err := os.Open(tmp)
		if err != nil {
			return n, err
		}
		err = check(r)
		r.Close()
		if err != nil {
			return n, err
		}
	}
	if err = f.Close(); err != nil {
		return n, err
	}
	if err = os.Rename(tmp, path); err != nil {
		return n, err
	}
	return n, syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// backupResult is what backup --json prints: one JSON object naming the
// copy written and what it holds.
type backupResult struct {
	Result string `json:"result"` // "backup"
	// Kind is server (a running single server's copy), cluster (a
	// cluster's data set, through a node) or offline (a stopped server's
	// directory, --data).
	Kind   string `json:"kind"`
	File   string `json:"file"`   // the copy, whole (--out)
	Bytes  int64  `json:"bytes"`  // its size
	SHA256 string `json:"sha256"` // of its bytes, hex, to check a copy of it later
	// Data is the directory copied (offline).
	Data string `json:"data,omitempty"`
	// Prefix, Revision and Keys say what a cluster backup holds: the etcd
	// prefix, the revision every key was read at, and how many keys.
	Prefix   string `json:"prefix,omitempty"`
	Revision int64  `json:"revision,omitempty"`
	Keys     int64  `json:"keys,omitempty"`
}
