package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// An invitation printed by participantctl invite admits the Go client's
// enroll into its conversation on a server with the invite policy, and
// only there; without one the enroll is invite_required.
func TestInvite_AdmitsEnrollIntoItsConversation(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	srv := servertest.Start(t, server.Config{DataDir: dir, EnrollPolicy: participant.EnrollInvite})
	defer srv.Stop()

	text := mustCtl(t, ctx, "invite", "--data", dir, "--conversation", "5", "--expires", "1h")
	inv, err := client.ParseInvite(text)
	if err != nil {
		t.Fatalf("ParseInvite(%q) = %v", text, err)
	}
	c, err := client.Dial(ctx, srv.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Enroll(ctx, 5); !errors.Is(err, client.ErrInviteRequired) {
		t.Fatalf("Enroll without an invitation = %v, want ErrInviteRequired", err)
	}
	if _, err := c.Enroll(ctx, 6, client.WithInvite(inv)); !errors.Is(err, client.ErrInviteInvalid) {
		t.Fatalf("Enroll into 6 with an invitation to 5 = %v, want ErrInviteInvalid", err)
	}
	cred, err := c.Enroll(ctx, 5, client.WithInvite(inv))
	if err != nil {
		t.Fatalf("Enroll with the invitation = %v", err)
	}
	if cred.Conversation != 5 || cred.Generation != 1 {
		t.Fatalf("Enroll with the invitation = %+v", cred)
	}

	// participantctl enroll passes it too.
	creds := filepath.Join(t.TempDir(), "p.creds")
	if _, errs, code := ctl(ctx, "", "enroll", "--addr", srv.Addr().String(), "--conversation", "5", "--creds", creds); code == 0 || !strings.Contains(errs, "invite_required") {
		t.Fatalf("participantctl enroll without --invite = exit %d, %q; want invite_required", code, errs)
	}
	mustCtl(t, ctx, "enroll", "--addr", srv.Addr().String(), "--conversation", "5", "--creds", creds, "--invite", strings.TrimSpace(text))

	// --uses 1 admits one enroll.
	once, err := client.ParseInvite(mustCtl(t, ctx, "invite", "--data", dir, "--conversation", "5", "--uses", "1"))
	if err != nil || len(once) != participant.InviteUsesSize {
		t.Fatalf("invite --uses 1 = %d bytes, %v, want %d", len(once), err, participant.InviteUsesSize)
	}
	for i, want := range []error{nil, client.ErrInviteInvalid} {
		ci, err := client.Dial(ctx, srv.Addr().String(), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer ci.Close()
		if _, err := ci.Enroll(ctx, 5, client.WithInvite(once)); !errors.Is(err, want) {
			t.Fatalf("Enroll %d with a one-use invitation = %v, want %v", i, err, want)
		}
	}
}

// invite never creates a node key, and checks its flags.
func TestInvite_Errors(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	if _, errs, code := ctl(ctx, "", "invite", "--data", dir, "--conversation", "1"); code != 1 || !strings.Contains(errs, "node.key") {
		t.Fatalf("invite without node.key = exit %d, %q; want 1 naming node.key", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, participant.NodeKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("invite created %s: %v", participant.NodeKeyFile, err)
	}
	for _, args := range [][]string{{"invite", "--data", dir}, {"invite", "--data", dir, "--conversation", "1", "--expires", "-1h"}} {
		if _, _, code := ctl(ctx, "", args...); code != 2 {
			t.Errorf("participantctl %s = exit %d, want 2", strings.Join(args, " "), code)
		}
	}
}

// invite --json prints one JSON object: the invitation's text (which
// admits the enroll) and what it admits.
func TestInvite_JSON(t *testing.T) {
	ctx := testCtx(t)
	dir := t.TempDir()
	srv := servertest.Start(t, server.Config{DataDir: dir, EnrollPolicy: participant.EnrollInvite})
	out := mustCtl(t, ctx, "invite", "--data", dir, "--conversation", "5", "--uses", "2", "--json")
	var r inviteResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Conversation != 5 || r.Uses != 2 || r.ValidUntil == "" || strings.Count(out, "\n") != 1 {
		t.Fatalf("invite --json = %q (%v), want one object for conversation 5, 2 uses, its validity", out, err)
	}
	if _, err := time.Parse(time.RFC3339, r.ValidUntil); err != nil {
		t.Errorf("invite --json valid_until = %q: %v", r.ValidUntil, err)
	}
	creds := filepath.Join(t.TempDir(), "p.creds")
	mustCtl(t, ctx, "enroll", "--addr", srv.Addr().String(), "--conversation", "5", "--creds", creds, "--invite", r.Invite)
}
