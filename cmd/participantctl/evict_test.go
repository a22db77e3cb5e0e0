package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/internal/cli"
)

// participantctl evict and drop against a running server: the token is
// required, a participant is evicted once (again: retired), a drop evicts
// the rest, and a conversation that does not exist is named.
func TestEvictDrop_Online(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	addr, health := startAdminServer(t, data, "s3cret")
	a, b := filepath.Join(work, "a.json"), filepath.Join(work, "b.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", a)
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", b)

	if _, errs, code := ctl(ctx, "", "evict", "--health", health, "--admin-token", "wrong", "--conversation", "7", "--participant", "0"); code == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("evict with a wrong token = exit %d, %q; want a 401 refusal", code, errs)
	}
	if _, _, code := ctl(ctx, "", "evict", "--health", health, "--admin-token", "s3cret", "--conversation", "7"); code != cli.ExitUsage {
		t.Errorf("evict without --participant = exit %d, want %d", code, cli.ExitUsage)
	}
	if got := mustCtl(t, ctx, "evict", "--health", health, "--admin-token", "s3cret", "--conversation", "7", "--participant", "0"); !strings.Contains(got, "participant 0 of conversation 7 evicted") {
		t.Errorf("evict = %q", got)
	}
	if _, errs, code := ctl(ctx, "", "evict", "--health", health, "--admin-token", "s3cret", "--conversation", "7", "--participant", "0"); code == 0 || !strings.Contains(errs, "retired") {
		t.Errorf("evict again = exit %d, %q; want retired", code, errs)
	}
	if got := mustCtl(t, ctx, "drop", "--health", health, "--admin-token", "s3cret", "--conversation", "7"); !strings.Contains(got, "1 participants evicted") || !strings.Contains(got, "participant 1 at seq") {
		t.Errorf("drop = %q, want participant 1 evicted", got)
	}
	if _, errs, code := ctl(ctx, "", "drop", "--health", health, "--admin-token", "s3cret", "--conversation", "8"); code == 0 || !strings.Contains(errs, "unknown_participant") {
		t.Errorf("drop of a conversation that does not exist = exit %d, %q; want unknown_participant", code, errs)
	}
}

// evict --json and drop --json print the server's answer as one JSON
// object each.
func TestEvictDrop_JSON(t *testing.T) {
	ctx := testCtx(t)
	data, work := t.TempDir(), t.TempDir()
	addr, health := startAdminServer(t, data, "s3cret")
	for _, name := range []string{"a.json", "b.json"} {
		mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", filepath.Join(work, name))
	}
	var ev evictResult
	out := mustCtl(t, ctx, "evict", "--json", "--health", health, "--admin-token", "s3cret", "--conversation", "7", "--participant", "0")
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Result != "evicted" || ev.Conversation != 7 || ev.Participant == nil || *ev.Participant != 0 || ev.Seq == 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("evict --json = %q (%v), want one object: evicted, conversation 7, participant 0, its seq", out, err)
	}
	var dr evictResult
	out = mustCtl(t, ctx, "drop", "--health", health, "--admin-token", "s3cret", "--conversation", "7", "--json")
	if err := json.Unmarshal([]byte(out), &dr); err != nil || dr.Result != "dropped" || dr.Conversation != 7 || len(dr.Evicted) != 1 || dr.Evicted[0].Participant != 1 || dr.Evicted[0].Seq <= ev.Seq {
		t.Errorf("drop --json = %q (%v), want one object: dropped, conversation 7, participant 1 evicted after seq %d", out, err, ev.Seq)
	}
}
