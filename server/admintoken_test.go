package server_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

// TestLocalAdminToken_WrittenOpensAdminAndIsRemovedWhenNotGenerated: with
// LocalAdminToken, no AdminToken and a loopback health listener, the
// server writes a generated token to AdminTokenFile (0600), which the
// admin endpoints accept and a wrong token does not; each start writes a
// new one; a start with an explicit AdminToken removes the file, so that
// no dead token is offered.
func TestLocalAdminToken_WrittenOpensAdminAndIsRemovedWhenNotGenerated(t *testing.T) {
	data := t.TempDir()
	path := filepath.Join(data, server.AdminTokenFile)
	status := func(srv *servertest.Server, token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+srv.HealthAddr().String()+"/admin/conversations/1", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var tokens []string
	for range 2 {
		srv := servertest.Start(t, server.Config{DataDir: data, LocalAdminToken: true})
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", path, fi.Mode().Perm())
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tok := strings.TrimSpace(string(b))
		if len(tok) != 64 {
			t.Fatalf("token %q: want 64 hex digits", tok)
		}
		tokens = append(tokens, tok)
		if got := status(srv, tok); got != http.StatusNotFound { // no conversation 1, but authorized
			t.Errorf("admin request with the file's token: %d, want 404 (no such conversation)", got)
		}
		if got := status(srv, "wrong"); got != http.StatusUnauthorized {
			t.Errorf("admin request with a wrong token: %d, want 401", got)
		}
		if err := srv.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if tokens[0] == tokens[1] {
		t.Error("two starts generated the same token")
	}
	srv := servertest.Start(t, server.Config{DataDir: data, LocalAdminToken: true, AdminToken: "explicit"})
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s left by an earlier start survives a start with an explicit admin token: %v", path, err)
	}
	if got := status(srv, tokens[1]); got != http.StatusUnauthorized {
		t.Errorf("the old generated token: %d, want 401", got)
	}
	if got := status(srv, "explicit"); got != http.StatusNotFound {
		t.Errorf("the explicit token: %d, want 404 (no such conversation)", got)
	}
}
