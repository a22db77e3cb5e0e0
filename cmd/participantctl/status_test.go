package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// TestStatus_SingleNode: status of a conversation with a sender and a
// reader prints the owner, the state, the backlog and one row per
// participant; --json prints the server's answer; an unknown conversation,
// a missing token and a server without admin endpoints are told apart.
func TestStatus_SingleNode(t *testing.T) {
	ctx := testCtx(t)
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir(), AdminToken: "s3cret"})
	addr, health := srv.Addr().String(), srv.HealthAddr().String()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "5", "--creds", a)
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "5", "--creds", b)
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "hello")

	js := mustCtl(t, ctx, "status", "--health", health, "--admin-token", "s3cret", "--json", "5")
	var st server.ConversationStatus
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatalf("status --json = %q: %v", js, err)
	}
	// Participant 0 told (its tell attached it again, generation 2); 1
	// never read: it holds back every record addressed to it. Both
	// connections ended with their commands.
	if !st.Here || st.Owner != nil || !st.Loaded || len(st.Participants) != 2 || st.Backlog.Records == 0 {
		t.Fatalf("status --json = %+v, want here, loaded, 2 participants, a backlog", st)
	}
	if p := st.Participants[0]; p.Generation != 2 || p.Bound {
		t.Errorf("participant 0 = %+v, want generation 2, unbound", p)
	}
	if p := st.Participants[1]; p.Acked != 0 || p.Unacked == 0 {
		t.Errorf("participant 1 = %+v, want cursor 0 and records held back", p)
	}

	out := mustCtl(t, ctx, "status", "--health", health, "--admin-token", "s3cret", "5")
	for _, want := range []string{
		"conversation 5\n",
		"owner:     this node (single node)\n",
		fmt.Sprintf("state:     loaded, %d oplog rows, last seq %d\n", st.OplogRows, st.LastSeq),
		fmt.Sprintf("backlog:   %d records from seq %d, %d payload bytes in memory, 0 evicted\n", st.Backlog.Records, st.Backlog.FirstSeq, st.Backlog.MemoryBytes),
		"PARTICIPANT  GENERATION  BINDING  ACKED  OFFERED  UNACKED  RELEASED\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	rows := strings.Split(strings.TrimSpace(out), "\n")
	for i, p := range st.Participants {
		want := []string{fmt.Sprint(p.Participant), fmt.Sprint(p.Generation), "unbound", "0", "0", fmt.Sprint(p.Unacked), "-"}
		if got := strings.Fields(rows[len(rows)-2+i]); !slices.Equal(got, want) {
			t.Errorf("row of participant %d = %q, want %q", p.Participant, got, want)
		}
	}

	if _, errs, code := ctl(ctx, "", "status", "--health", health, "--admin-token", "s3cret", "6"); code != 1 || !strings.Contains(errs, "no conversation 6") {
		t.Errorf("status of an unknown conversation = exit %d, %q; want 1, no conversation 6", code, errs)
	}
	if _, errs, code := ctl(ctx, "", "status", "--health", health, "5"); code != cli.ExitUsage || !strings.Contains(errs, "admin token") {
		t.Errorf("status without a token = exit %d, %q; want %d naming the admin token", code, errs, cli.ExitUsage)
	}
	off := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	if _, errs, code := ctl(ctx, "", "status", "--health", off.HealthAddr().String(), "--admin-token", "s3cret", "5"); code != 1 || !strings.Contains(errs, "--admin-token-file") {
		t.Errorf("status of a server without admin endpoints = exit %d, %q; want 1 naming --admin-token-file", code, errs)
	}
}

// TestStatus_FollowsTheOwner: asked of a node that does not own the
// conversation, status follows the owner's health URL and prints the
// owner's answer; with --no-follow it prints the owner alone.
func TestStatus_FollowsTheOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("an embedded etcd and 2 nodes")
	}
	ctx := testCtx(t)
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	node := func(id string) *servertest.Server {
		return servertest.Start(t, server.Config{DataDir: t.TempDir(), AdminToken: "s3cret", DrainTimeout: 5 * time.Second,
			Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: id, Prefix: "/status/", LeaseTTL: 2 * time.Second}})
	}
	a, b := node("a"), node("b")
	creds := filepath.Join(t.TempDir(), "p.json")
	mustCtl(t, ctx, "enroll", "--addr", a.Addr().String(), "--conversation", "8", "--creds", creds)

	owner := "owner:     node a, wire " + a.Addr().String() + ", health http://" + a.HealthAddr().String() + "\n"
	out := mustCtl(t, ctx, "status", "--health", b.HealthAddr().String(), "--admin-token", "s3cret", "8")
	if !strings.Contains(out, owner) || !strings.Contains(out, "state:     loaded,") || strings.Contains(out, "asked:") {
		t.Errorf("status through b = \n%s\nwant the owner a's answer: %q, loaded", out, owner)
	}
	out = mustCtl(t, ctx, "status", "--health", b.HealthAddr().String(), "--admin-token", "s3cret", "--no-follow", "8")
	if !strings.Contains(out, owner) || !strings.Contains(out, "asked:     node b, which does not serve it") || strings.Contains(out, "PARTICIPANT") {
		t.Errorf("status --no-follow through b = \n%s\nwant the owner and no table", out)
	}
}

// TestStatus_LocalAdminToken: a server started without an admin token,
// its health listener on loopback, writes a generated token to its data
// directory (0600), and status on the same host finds it with --data and
// no token set; a data directory without the file is a usage error that
// names it.
func TestStatus_LocalAdminToken(t *testing.T) {
	ctx := testCtx(t)
	data := t.TempDir()
	srv := servertest.Start(t, server.Config{DataDir: data, LocalAdminToken: true})
	addr, health := srv.Addr().String(), srv.HealthAddr().String()
	fi, err := os.Stat(filepath.Join(data, server.AdminTokenFile))
	if err != nil {
		t.Fatalf("no %s in the data directory: %v", server.AdminTokenFile, err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", server.AdminTokenFile, fi.Mode().Perm())
	}
	creds := filepath.Join(t.TempDir(), "a.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "5", "--creds", creds)
	out := mustCtl(t, ctx, "status", "--health", health, "--data", data, "5")
	if !strings.Contains(out, "conversation 5\n") || !strings.Contains(out, "owner:     this node (single node)\n") {
		t.Errorf("status with the data directory's token:\n%s", out)
	}
	empty := t.TempDir()
	if _, errs, code := ctl(ctx, "", "status", "--health", health, "--data", empty, "5"); code != cli.ExitUsage ||
		!strings.Contains(errs, filepath.Join(empty, server.AdminTokenFile)+" does not exist") {
		t.Errorf("status with a data directory holding no token = exit %d, %q; want %d naming the file", code, errs, cli.ExitUsage)
	}
}

// TestLoopbackHealth: the local token file is read only for a health
// listener on this host.
func TestLoopbackHealth(t *testing.T) {
	for health, want := range map[string]bool{
		"127.0.0.1:7421": true, "localhost:7421": true, "[::1]:7421": true, "http://127.0.0.1:7421": true,
		"https://localhost:7421/": true, "127.0.0.2:1": true,
		"10.0.0.1:7421": false, "node2:7442": false, "http://example.com:7421": false, "0.0.0.0:7421": false,
	} {
		if got := loopbackHealth(health); got != want {
			t.Errorf("loopbackHealth(%q) = %v, want %v", health, got, want)
		}
	}
}
