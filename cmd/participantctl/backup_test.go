package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// startAdminServer runs an in-process participantd on dir with an admin
// token and returns its wire and health addresses.
func startAdminServer(t *testing.T, dir, token string) (string, string) {
	t.Helper()
	srv := servertest.Start(t, server.Config{DataDir: dir, AdminToken: token})
	return srv.Addr().String(), srv.HealthAddr().String()
}

// TestBackupRestore_ServesTheSameAnswers backs up a running server, restores
// the copy into an empty directory (verified), starts a server on it, and
// retries a tell there: the original seq comes back as a replay, and the
// participant's credentials still attach.
func TestBackupRestore_ServesTheSameAnswers(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	addr, health := startAdminServer(t, data, "s3cret")
	a := filepath.Join(work, "a.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", a)
	tok := client.NewToken().String()
	seq := strings.TrimSpace(mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "--token", tok, "kept"))

	// Without or with a wrong token the server refuses.
	out := filepath.Join(work, "backup.db")
	if _, errs, code := ctl(ctx, "", "backup", "--health", health, "--admin-token", "wrong", "--out", out); code == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("backup with a wrong token = exit %d, %q; want a 401 refusal", code, errs)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused backup left %s (%v)", out, err)
	}
	mustCtl(t, ctx, "backup", "--health", health, "--admin-token", "s3cret", "--out", out)
	if _, errs, code := ctl(ctx, "", "backup", "--health", health, "--admin-token", "s3cret", "--out", out); code == 0 || !strings.Contains(errs, "exists") {
		t.Fatalf("backup over an existing file = exit %d, %q; want a refusal", code, errs)
	}

	restored := filepath.Join(work, "restored")
	key := filepath.Join(data, participant.NodeKeyFile)
	got := mustCtl(t, ctx, "restore", "--from", out, "--node-key", key, "--data", restored)
	if !strings.Contains(got, "conversation 7: ok") {
		t.Fatalf("restore = %q, want conversation 7 verified ok", got)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--from", out, "--node-key", key, "--data", restored); code == 0 || !strings.Contains(errs, "not empty") {
		t.Fatalf("restore into a non-empty directory = exit %d, %q; want a refusal", code, errs)
	}

	addr2, _ := startAdminServer(t, restored, "")
	if again := strings.TrimSpace(mustCtl(t, ctx, "tell", "--addr", addr2, "--creds", a, "--token", tok, "kept")); again != seq {
		t.Fatalf("tell retried on the restored server = %s, want the original seq %s", again, seq)
	}
}

// Issue 18 item 4: the backup reaches a health listener served over HTTPS,
// verified with --health-ca; plain HTTP to it fails.
func TestBackup_OverHTTPS(t *testing.T) {
	ctx := testCtx(t)
	dir, work := t.TempDir(), t.TempDir()
	certFile, keyFile, _ := servertest.SelfSigned(t, work)
	srv := servertest.Start(t, server.Config{DataDir: dir, AdminToken: "s3cret", HealthTLSCert: certFile, HealthTLSKey: keyFile})
	health := srv.HealthAddr().String()
	out := filepath.Join(work, "backup.db")
	if _, _, code := ctl(ctx, "", "backup", "--health", health, "--admin-token", "s3cret", "--out", out); code == 0 {
		t.Fatal("backup over plain HTTP to an HTTPS health listener succeeded")
	}
	mustCtl(t, ctx, "backup", "--health", health, "--health-ca", certFile, "--admin-token", "s3cret", "--out", out)
	if fi, err := os.Stat(out); err != nil || fi.Size() < 4096 {
		t.Fatalf("backup over HTTPS wrote %v, %v", fi, err)
	}
	if _, errs, code := ctl(ctx, "", "backup", "--health", "https://"+health, "--admin-token", "s3cret", "--out", out+"2"); code == 0 || !strings.Contains(errs, "certificate") {
		t.Fatalf("backup over HTTPS without --health-ca = exit %d, %q; want a certificate error", code, errs)
	}
}

// TestRestore_CredentialNewerThanTheData: a credential minted after the
// backup (an attach after it) is refused stale_authority on the restored
// server, and tell says that the data was restored from a backup older
// than the credential (naming the restore marker's backup) and points to
// docs/operations.md, instead of blaming another session; restore leaves
// that marker in the directory.
func TestRestore_CredentialNewerThanTheData(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	addr, health := startAdminServer(t, data, "s3cret")
	a := filepath.Join(work, "a.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", a)
	out := filepath.Join(work, "backup.db")
	mustCtl(t, ctx, "backup", "--health", health, "--admin-token", "s3cret", "--out", out)
	// After the backup: this tell attaches again, which mints the
	// generation a.json now holds.
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "after the backup")

	restored := filepath.Join(work, "restored")
	mustCtl(t, ctx, "restore", "--from", out, "--node-key", filepath.Join(data, participant.NodeKeyFile), "--data", restored)
	marker, err := os.ReadFile(filepath.Join(restored, server.RestoredFile))
	if err != nil {
		t.Fatalf("restore left no %s marker: %v", server.RestoredFile, err)
	}
	if !strings.Contains(string(marker), "backup.db") {
		t.Errorf("marker %q does not name the backup", marker)
	}
	addr2, _ := startAdminServer(t, restored, "")
	_, errs, code := ctl(ctx, "", "tell", "--addr", addr2, "--creds", a, "on the restored server")
	if code == 0 {
		t.Fatal("a credential newer than the restored data attached")
	}
	for _, want := range []string{"stale_authority", "restored from a backup", "older than", "backup.db", "docs/operations.md"} {
		if !strings.Contains(errs, want) {
			t.Errorf("tell's refusal lacks %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "another session") {
		t.Errorf("tell's refusal blames another session:\n%s", errs)
	}
}

// backupJSON runs backup with --json and decodes its one JSON object,
// checking that it names the file written, its size and its SHA-256.
func backupJSON(t *testing.T, ctx context.Context, args ...string) backupResult {
	t.Helper()
	out := mustCtl(t, ctx, append([]string{"backup", "--json"}, args...)...)
	var r backupResult
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("backup --json = %q, want one JSON object (%v)", out, err)
	}
	b, err := os.ReadFile(r.File)
	if err != nil {
		t.Fatalf("backup --json names %q: %v", r.File, err)
	}
	sum := sha256.Sum256(b)
	if r.Result != "backup" || r.Bytes != int64(len(b)) || r.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("backup --json = %+v, want result backup, %d bytes, sha256 %x", r, len(b), sum)
	}
	return r
}

// backup --json prints one JSON object per backup: an online copy of a
// single server, and a stopped server's directory copied offline.
func TestBackup_JSON(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	_, health := startAdminServer(t, data, "s3cret")
	online := filepath.Join(work, "online.db")
	if r := backupJSON(t, ctx, "--health", health, "--admin-token", "s3cret", "--out", online); r.Kind != "server" || r.File != online || r.Data != "" {
		t.Errorf("online backup --json = %+v, want kind server of %s", r, online)
	}
	// Flags after --json in any order, and the offline copy of the
	// restored directory (a stopped server's).
	restored := filepath.Join(work, "restored")
	mustCtl(t, ctx, "restore", "--from", online, "--node-key", filepath.Join(data, participant.NodeKeyFile), "--data", restored)
	offline := filepath.Join(work, "offline.db")
	if r := backupJSON(t, ctx, "--out", offline, "--data", restored); r.Kind != "offline" || r.Data != restored || r.File != offline {
		t.Errorf("offline backup --json = %+v, want kind offline of %s", r, restored)
	}
}

// restore --json prints JSON lines: first the restore's object, then
// verify --json's object per conversation.
func TestRestore_JSON(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	addr, health := startAdminServer(t, data, "s3cret")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", filepath.Join(work, "a.json"))
	file := filepath.Join(work, "backup.db")
	b := backupJSON(t, ctx, "--health", health, "--admin-token", "s3cret", "--out", file)
	restored := filepath.Join(work, "restored")
	out := mustCtl(t, ctx, "restore", "--json", "--from", file, "--node-key", filepath.Join(data, participant.NodeKeyFile), "--data", restored)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r restoreResult
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil || r.Result != "restored" || r.From != file || r.Data != restored || r.Bytes != b.Bytes {
		t.Errorf("restore --json's first line = %q (%v), want restored, from %s into %s, %d bytes", lines[0], err, file, restored, b.Bytes)
	}
	var v verifyLine
	if len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &v) != nil || v.Conversation != 7 || v.Status != "ok" {
		t.Errorf("restore --json = %q, want the restore's line, then conversation 7 ok", out)
	}
}
