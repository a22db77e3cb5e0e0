package main

import (
	"context"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/logfirst"
)

// crashImage runs the service on a log-first store that never checkpoints
// and copies its data directory while it is still open: the image is what
// a crash leaves, every batch in the log and none in bbolt.
func crashImage(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := logfirst.Open(dir, logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: math.MaxInt64, SegmentSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc, err := participant.Open(ctx, st, participant.Options{NodeKey: make([]byte, participant.NodeKeySize)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	conn := svc.Connect(nil)
	for conv := participant.ConversationID(1); conv <= 2; conv++ {
		a, err := conn.Enroll(ctx, participant.Enroll{Conversation: conv, Token: participant.Token{byte(conv), 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Tell(ctx, participant.Tell{Conversation: conv, Participant: a.Participant, Generation: a.Generation,
			Token: participant.Token{byte(conv), 3}, Payload: []byte("hi")}); err != nil {
			t.Fatal(err)
		}
	}
	image := t.TempDir()
	copyTree(t, dir, image)
	return image
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func fileBytes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		out[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestVerify_ReplaysTheLogReadOnly(t *testing.T) {
	ctx := testCtx(t)
	dir := crashImage(t)
	before := fileBytes(t, dir)
	out := mustCtl(t, ctx, "verify", "--data", dir)
	if !strings.HasPrefix(out, "log: ok, ") || !strings.Contains(out, "conversation 1: ok\nconversation 2: ok\n") {
		t.Fatalf("verify = %q, want the log's records and both conversations ok", out)
	}
	out = mustCtl(t, ctx, "inspect", "--data", dir)
	if !strings.Contains(out, "conversation 2: oplog") {
		t.Fatalf("inspect = %q, want conversation 2 read from the log", out)
	}
	if diff := cmp.Diff(before, fileBytes(t, dir)); diff != "" {
		t.Fatalf("verify and inspect changed files (-before +after):\n%s", diff)
	}
}

// corruptLogImage is a crash image whose log's first record, with more
// after it, is damaged at offset 16 of the one segment it returns.
func corruptLogImage(t *testing.T) (dir, seg string) {
	t.Helper()
	dir = crashImage(t)
	segs, err := filepath.Glob(filepath.Join(dir, logfirst.WALDir, "*.wal"))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments = %v, %v", segs, err)
	}
	raw, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	raw[16+20] ^= 1 // in the first record, with more after it
	if err := os.WriteFile(segs[0], raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, segs[0]
}

func TestVerify_CorruptLog_NamesSegmentAndOffset(t *testing.T) {
	ctx := testCtx(t)
	dir, seg := corruptLogImage(t)
	out, errs, code := ctl(ctx, "", "verify", "--data", dir)
	if code == 0 || !strings.Contains(errs, filepath.Base(seg)+" offset 16") {
		t.Fatalf("verify of a corrupt log = exit %d, stdout %q, stderr %q; want a failure naming %s offset 16", code, out, errs, filepath.Base(seg))
	}
}

// inspect --space reports the data file alone, but a log it cannot read
// (the next start refuses the directory) fails it, naming the damage,
// rather than going unsaid under figures that look whole.
func TestInspectSpace_CorruptLog_Fails(t *testing.T) {
	ctx := testCtx(t)
	dir, seg := corruptLogImage(t)
	out, errs, code := ctl(ctx, "", "inspect", "--data", dir, "--space")
	if code == 0 || !strings.Contains(errs, "log cannot be read") || !strings.Contains(errs, filepath.Base(seg)+" offset 16") {
		t.Fatalf("inspect --space of a corrupt log = exit %d, stdout %q, stderr %q; want a failure naming %s offset 16", code, out, errs, filepath.Base(seg))
	}
}

// TestOfflineWriters_CrashImage_TakeTheLog: on a directory a crash left,
// compact and backup --data bring the file up to date with the log first
// (both conversations survive, and no record is left after the file's
// checkpoint), and restore refuses the data file alone.
func TestOfflineWriters_CrashImage_TakeTheLog(t *testing.T) {
	ctx := testCtx(t)
	key := filepath.Join(t.TempDir(), "node.key")
	if err := os.WriteFile(key, make([]byte, participant.NodeKeySize), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := crashImage(t)
	if out := mustCtl(t, ctx, "inspect", "--data", dir, "--space"); !strings.Contains(out, "records after the file's checkpoint are not in these figures") {
		t.Fatalf("inspect --space of a crash image = %q, want the log's records named", out)
	}
	_, stderr, code := ctl(ctx, "", "restore", "--from", filepath.Join(dir, storeFile), "--node-key", key, "--data", filepath.Join(t.TempDir(), "r"))
	if code != 1 || !strings.Contains(stderr, "records after it") {
		t.Fatalf("restore of a crash image's data file = exit %d, %q; want refused for the log's records", code, stderr)
	}

	copy := filepath.Join(t.TempDir(), "copy.db")
	mustCtl(t, ctx, "backup", "--data", dir, "--out", copy)
	restored := filepath.Join(t.TempDir(), "r")
	out := mustCtl(t, ctx, "restore", "--from", copy, "--node-key", key, "--data", restored)
	if !strings.Contains(out, "conversation 1: ok\nconversation 2: ok\n") {
		t.Fatalf("restore of backup --data = %q, want both conversations ok", out)
	}

	dir = crashImage(t)
	mustCtl(t, ctx, "compact", "--data", dir, "--retain", "1ns")
	if n, err := offline.Pending(dir, offline.Options{}); err != nil || n != 0 {
		t.Fatalf("after compact, the log holds %d records after the file (%v); want 0", n, err)
	}
	if out := mustCtl(t, ctx, "verify", "--data", dir); out != "conversation 1: ok\nconversation 2: ok\n" {
		t.Fatalf("verify after compact = %q, want both conversations ok", out)
	}
}
