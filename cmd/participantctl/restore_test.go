package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/vfs"
)

// TestRestore_RefusesANonBackupBeforeWritingAnything restores files that
// are not whole backups (one of them a backup with one bit of a payload
// flipped): each is refused, naming the file given as what is
// wrong, and the data directory is left as it was (absent), so that the
// next restore, of the right file, can run.
func TestRestore_RefusesANonBackupBeforeWritingAnything(t *testing.T) {
	ctx := testCtx(t)
	work := t.TempDir()
	key := filepath.Join(work, "node.key")
	if err := os.WriteFile(key, make([]byte, participant.NodeKeySize), 0o600); err != nil {
		t.Fatal(err)
	}

	// A real data file, a few pages long, to cut short.
	good := filepath.Join(work, "good.db")
	st, err := boltstore.Open(good, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := st.Append("oplog/1", bytes.Repeat([]byte{'x'}, 100), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	// A bbolt file of someone else's layout.
	other := filepath.Join(work, "other.db")
	db, err := bolt.Open(other, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("things")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	junk := make([]byte, 64<<10)
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range junk {
		junk[i] = byte(rnd.IntN(256))
	}
	// One bit of one payload flipped: every page and key still in place,
	// only the value's checksum tells.
	flipped := bytes.Clone(whole)
	flipped[bytes.Index(flipped, bytes.Repeat([]byte{'x'}, 100))+50] ^= 0x01
	for name, content := range map[string][]byte{
		"text":      []byte("this is not a backup\n"),
		"empty":     nil,
		"random":    junk,
		"truncated": whole[:len(whole)/2],
		"flipped":   flipped,
	} {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"text", "empty", "random", "truncated", "flipped", "other.db"} {
		from := filepath.Join(work, name)
		data := filepath.Join(work, "data-"+name)
		out, errs, code := ctl(ctx, "", "restore", "--from", from, "--node-key", key, "--data", data)
		if code != 1 || out != "" {
			t.Errorf("restore of %s = exit %d, stdout %q; want 1 and nothing", name, code, out)
		}
		if !strings.Contains(errs, from+" is not a whole participantd backup") || strings.Contains(errs, "from a backup") {
			t.Errorf("restore of %s says %q; want it to name the file given as no backup, not to advise restoring one", name, errs)
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			t.Errorf("restore of %s left %s behind (%v); want nothing written", name, data, err)
		}
	}
	// The whole file restores.
	data := filepath.Join(work, "data")
	if out := mustCtl(t, ctx, "restore", "--from", good, "--node-key", key, "--data", data); !strings.HasPrefix(out, "restored ") {
		t.Errorf("restore of a whole file = %q", out)
	}
}

// syncRecorder is the operating system's file system, recording the
// directories it syncs.
type syncRecorder struct {
	vfs.FS
	synced []string
}

func (r *syncRecorder) SyncDir(dir string) error {
	r.synced = append(r.synced, filepath.Clean(dir))
	return r.FS.SyncDir(dir)
}

// TestRestore_SyncsTheParentOfEachDirectoryItCreates restores into a data
// directory whose parents are missing too: the parent of each directory
// restore creates is synced, so that a crash after the restore reported
// success cannot lose the directory and the restored files in it.
func TestRestore_SyncsTheParentOfEachDirectoryItCreates(t *testing.T) {
	ctx := testCtx(t)
	work := t.TempDir()
	key := filepath.Join(work, "node.key")
	if err := os.WriteFile(key, make([]byte, participant.NodeKeySize), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(work, "good.db")
	st, err := boltstore.Open(good, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	rec := &syncRecorder{FS: vfs.OS}
	restoreFS = rec
	defer func() { restoreFS = vfs.OS }()
	data := filepath.Join(work, "new", "deeper", "data")
	if out, errs, code := ctl(ctx, "", "restore", "--from", good, "--node-key", key, "--data", data); code != 0 {
		t.Fatalf("restore = exit %d, %q, %q", code, out, errs)
	}
	for _, want := range []string{work, filepath.Join(work, "new"), filepath.Join(work, "new", "deeper")} {
		if !slices.Contains(rec.synced, want) {
			t.Errorf("restore created a directory in %s without syncing it (synced %v)", want, rec.synced)
		}
	}
}
