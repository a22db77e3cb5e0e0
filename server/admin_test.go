package server_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/participantd/participantd/server"
)

func (h *harness) postBackup(token string) (int, []byte, string) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+h.srv.HealthAddr().String()+"/admin/backup", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("POST /admin/backup: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Get("Content-Length")
}

func TestAdmin_BackupIsOffWithoutATokenAndGuardedWithOne(t *testing.T) {
	off := start(t, server.Config{})
	if code, _, _ := off.postBackup("anything"); code != http.StatusNotFound {
		t.Errorf("POST /admin/backup without --admin-token = %d, want 404", code)
	}
	on := start(t, server.Config{AdminToken: "s3cret"})
	for _, token := range []string{"", "wrong", "s3cret2"} {
		if code, _, _ := on.postBackup(token); code != http.StatusUnauthorized {
			t.Errorf("POST /admin/backup with token %q = %d, want 401", token, code)
		}
	}
	code, body, length := on.postBackup("s3cret")
	if code != http.StatusOK || length != strconv.Itoa(len(body)) || len(body) < 4096 {
		t.Fatalf("POST /admin/backup = %d, %d bytes, Content-Length %q; want 200 and a whole data file", code, len(body), length)
	}
}
