package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestCluster_BackupVerifyRestore walks the cluster tools end to end on
// one embedded etcd: backup from a node, verify and inspect the live
// prefix (the etcd revision does not move: nothing is written or
// claimed) and the backup file (without etcd), restore into an empty
// prefix (verified), refuse a non-empty prefix, a damaged file and a
// backup of the other kind, and serve the restored prefix from a new node:
// a retried tell replays its original seq.
func TestCluster_BackupVerifyRestore(t *testing.T) {
	ctx := testCtx(t)
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	eps := strings.Join(etcd.Endpoints(), ",")
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	revision := func() int64 {
		t.Helper()
		resp, err := cli.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	count := func(prefix string) int64 {
		t.Helper()
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	node := func(id, prefix, token string) *servertest.Server {
		return servertest.Start(t, server.Config{
			DataDir: t.TempDir(), AdminToken: token, CheckpointInterval: time.Hour,
			Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: id, Prefix: prefix, LeaseTTL: 2 * time.Second},
		})
	}

	a := node("a", "/live/", "tok")
	work := t.TempDir()
	creds := filepath.Join(work, "c.json")
	addr := a.Addr().String()
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", creds)
	tok := client.NewToken().String()
	seq := strings.TrimSpace(mustCtl(t, ctx, "tell", "--addr", addr, "--creds", creds, "--token", tok, "kept"))

	// invite against the cluster mints under the secret in etcd, and
	// creates none where there is none.
	text := strings.TrimSpace(mustCtl(t, ctx, "invite", "--etcd-endpoints", eps, "--etcd-prefix", "/live/", "--conversation", "7"))
	inv, err := client.ParseInvite(text)
	if err != nil {
		t.Fatalf("invite --etcd-endpoints printed %q: %v", text, err)
	}
	kv, err := cli.Get(ctx, "/live/"+backup.NodeKeyKey)
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatalf("read the cluster secret: %v, %d keys", err, len(kv.Kvs))
	}
	until := time.UnixMilli(int64(binary.BigEndian.Uint64(inv[9:17])))
	secret, err := cluster.UnsealRel(backup.NodeKeyKey, kv.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if want, err := participant.MintInvite(secret, 7, time.Now(), until); err != nil || !bytes.Equal(inv, want) {
		t.Fatalf("invite --etcd-endpoints = %x, want %x minted under the cluster secret (%v)", inv, want, err)
	}
	if _, errs, code := ctl(ctx, "", "invite", "--etcd-endpoints", eps, "--etcd-prefix", "/nokey/", "--conversation", "7"); code == 0 || !strings.Contains(errs, "no /nokey/secret/node-key") || count("/nokey/") != 0 {
		t.Fatalf("invite against a prefix without a secret = exit %d, %q; want a refusal that creates nothing", code, errs)
	}

	file := filepath.Join(work, "cluster.backup")
	if _, errs, code := ctl(ctx, "", "backup", "--health", a.HealthAddr().String(), "--admin-token", "wrong", "--out", file); code == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("cluster backup with a wrong token = exit %d, %q; want a 401 refusal", code, errs)
	}
	if got := mustCtl(t, ctx, "backup", "--health", a.HealthAddr().String(), "--admin-token", "tok", "--out", file); !strings.Contains(got, "cluster backup") {
		t.Fatalf("backup = %q, want a cluster backup", got)
	}
	if r := backupJSON(t, ctx, "--health", a.HealthAddr().String(), "--admin-token", "tok", "--out", file+".json"); r.Kind != "cluster" || r.Prefix != "/live/" || r.Keys == 0 || r.Revision == 0 {
		t.Errorf("cluster backup --json = %+v, want kind cluster of /live/ with its keys and revision", r)
	}

	// The live prefix, read while node a holds its lease and ownership.
	before := revision()
	if got := mustCtl(t, ctx, "verify", "--etcd-endpoints", eps, "--etcd-prefix", "/live/"); !strings.Contains(got, "conversation 7: ok") {
		t.Fatalf("verify --etcd-endpoints = %q, want conversation 7 ok", got)
	}
	var rep inspectReport
	if err := json.Unmarshal([]byte(mustCtl(t, ctx, "inspect", "--etcd-endpoints", eps, "--etcd-prefix", "/live", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Conversations) != 1 || rep.Conversations[0].Conversation != 7 || rep.Conversations[0].LastSeq == 0 ||
		rep.Cluster == nil || len(rep.Cluster.Nodes) != 1 || rep.Cluster.Revision != before {
		t.Fatalf("inspect --etcd-endpoints = %+v (cluster %+v), want conversation 7 with records, node a, revision %d", rep.Conversations, rep.Cluster, before)
	}
	if after := revision(); after != before {
		t.Fatalf("verify and inspect moved the etcd revision from %d to %d: they wrote", before, after)
	}

	// The backup file, without etcd.
	if got := mustCtl(t, ctx, "verify", "--from", file); !strings.Contains(got, "conversation 7: ok") || !strings.Contains(got, "backup") {
		t.Fatalf("verify --from = %q, want conversation 7 ok", got)
	}
	if _, errs, code := ctl(ctx, "", "verify", "--from", file, "--etcd-endpoints", eps); code != 2 || !strings.Contains(errs, "one of") {
		t.Fatalf("verify with two sources = exit %d, %q; want a usage error", code, errs)
	}

	// Refusals: a damaged file, a single-node file, a cluster file into a
	// data directory, a non-empty prefix.
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	flipped := filepath.Join(work, "flipped.backup")
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 1
	if err := os.WriteFile(flipped, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--etcd-endpoints", eps, "--etcd-prefix", "/flipped/", "--from", flipped); code == 0 || !strings.Contains(errs, "corrupt") {
		t.Fatalf("restore of a damaged file = exit %d, %q; want a refusal", code, errs)
	}
	if _, errs, code := ctl(ctx, "", "verify", "--from", flipped); code == 0 || !strings.Contains(errs, "corrupt") {
		t.Fatalf("verify of a damaged file = exit %d, %q; want a refusal", code, errs)
	}
	single := filepath.Join(work, "single.db")
	if err := os.WriteFile(single, []byte("a bbolt file, not a cluster backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--etcd-endpoints", eps, "--etcd-prefix", "/single/", "--from", single); code == 0 || !strings.Contains(errs, "not a cluster backup") {
		t.Fatalf("restore of a single-node file into etcd = exit %d, %q; want a refusal", code, errs)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--from", file, "--node-key", single, "--data", filepath.Join(work, "d")); code == 0 || !strings.Contains(errs, "is a cluster backup") {
		t.Fatalf("restore of a cluster file into a data directory = exit %d, %q; want a refusal", code, errs)
	}
	if n := count("/flipped/") + count("/single/"); n != 0 {
		t.Fatalf("refused restores wrote %d keys", n)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--etcd-endpoints", eps, "--etcd-prefix", "/live/", "--from", file); code == 0 || !strings.Contains(errs, "not empty") {
		t.Fatalf("restore into the live prefix = exit %d, %q; want a refusal", code, errs)
	}
	// A prefix wiped but for another node key: refused without
	// --replace-node-key, nothing written; restored with it.
	if _, err := cli.Put(ctx, "/rekeyed/"+backup.NodeKeyKey, strings.Repeat("k", participant.NodeKeySize)); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--etcd-endpoints", eps, "--etcd-prefix", "/rekeyed/", "--from", file); code == 0 || !strings.Contains(errs, "--replace-node-key") {
		t.Fatalf("restore over another node key = exit %d, %q; want a refusal naming --replace-node-key", code, errs)
	}
	if n := count("/rekeyed/"); n != 1 {
		t.Fatalf("refused restore left %d keys, want the node key alone", n)
	}
	if _, errs, code := ctl(ctx, "", "restore", "--from", file, "--replace-node-key"); code != 2 || !strings.Contains(errs, "needs --etcd-endpoints") {
		t.Fatalf("--replace-node-key without --etcd-endpoints = exit %d, %q; want a usage error", code, errs)
	}
	if got := mustCtl(t, ctx, "restore", "--etcd-endpoints", eps, "--etcd-prefix", "/rekeyed/", "--from", file, "--replace-node-key"); !strings.Contains(got, "conversation 7: ok") {
		t.Fatalf("restore --replace-node-key = %q, want conversation 7 verified ok", got)
	}

	// Restore into an empty prefix and serve it from a new node.
	if got := mustCtl(t, ctx, "restore", "--etcd-endpoints", eps, "--etcd-prefix", "/restored/", "--from", file); !strings.Contains(got, "conversation 7: ok") {
		t.Fatalf("restore = %q, want conversation 7 verified ok", got)
	}
	if n := count("/restored/own/") + count("/restored/node/a"); n != 0 {
		t.Fatalf("restore wrote %d ownership or live-node keys", n)
	}
	b := node("b", "/restored/", "")
	if again := strings.TrimSpace(mustCtl(t, ctx, "tell", "--addr", b.Addr().String(), "--creds", creds, "--token", tok, "kept")); again != seq {
		t.Fatalf("tell retried on the restored prefix = %s, want the original seq %s", again, seq)
	}
	if _, err := os.Stat(filepath.Join(work, participant.NodeKeyFile)); !os.IsNotExist(err) {
		t.Fatalf("restore wrote a node key file: %v", err)
	}

	// --json: the restore's object, then verify's per conversation.
	lines := strings.Split(strings.TrimSpace(mustCtl(t, ctx, "restore", "--json", "--etcd-endpoints", eps, "--etcd-prefix", "/json/", "--from", file)), "\n")
	var r restoreResult
	var v verifyLine
	if json.Unmarshal([]byte(lines[0]), &r) != nil || r.Result != "restored" || r.Prefix != "/json/" || r.BackupPrefix != "/live/" || r.Keys == 0 || r.Txns == 0 || r.Revision == 0 ||
		len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &v) != nil || v.Conversation != 7 || v.Status != "ok" {
		t.Errorf("restore --json of a cluster backup = %q, want the restore's object into /json/, then conversation 7 ok", lines)
	}
}

// TestBackup_ClusterCopyCutIsNotKept: a cluster backup whose stream ends
// early (no trailer, or a wrong checksum) is refused and leaves no file;
// a whole one is kept.
func TestBackup_ClusterCopyCutIsNotKept(t *testing.T) {
	ctx := testCtx(t)
	var whole bytes.Buffer
	w, err := backup.NewWriter(&whole, backup.Header{Prefix: "/p/", Revision: 9, Keys: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"d/a", "d/b"} {
		if err := w.Add([]byte(k), []byte("value of "+k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", server.ClusterBackupContentType)
		rw.Write(body)
	}))
	defer srv.Close()
	health := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"cut":        whole.Bytes()[:whole.Len()-5],
		"no-trailer": whole.Bytes()[:whole.Len()-48],
	} {
		body = b
		out := filepath.Join(dir, name)
		if _, errs, code := ctl(ctx, "", "backup", "--health", health, "--admin-token", "t", "--out", out); code == 0 || !strings.Contains(errs, "corrupt") {
			t.Fatalf("%s: backup = exit %d, %q; want a refusal", name, code, errs)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("%s: a refused backup left %s (%v)", name, out, err)
		}
		if _, err := os.Stat(out + ".partial"); !os.IsNotExist(err) {
			t.Fatalf("%s: a refused backup left %s.partial (%v)", name, out, err)
		}
	}
	body = whole.Bytes()
	out := filepath.Join(dir, "whole")
	if got := mustCtl(t, ctx, "backup", "--health", health, "--admin-token", "t", "--out", out); !strings.Contains(got, "2 keys of /p/ at etcd revision 9") {
		t.Fatalf("backup = %q", got)
	}
}
