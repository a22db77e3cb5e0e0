package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/server"
)

// Issue 27 item 6: every admin read (a conversation's status, pprof pages
// and goroutine dumps, the ids of unloadable conversations) leaves an
// audit line with the peer, the path and the outcome; reads without the
// token (/metrics, the unloadable count) and the token itself leave none.
func TestAdmin_ReadsAreAudited(t *testing.T) {
	var buf lockedBuffer
	h := start(t, server.Config{AdminToken: adminToken, Pprof: true, Logger: zerolog.New(&buf)})
	reads := []struct {
		path string
		want int
	}{
		{"/admin/conversations/7", http.StatusNotFound},
		{"/debug/pprof/goroutine?debug=2", http.StatusOK},
		{"/debug/pprof/", http.StatusOK},
		{"/unloadable-conversations", http.StatusOK},
	}
	for _, rd := range reads {
		if code, _ := h.do("GET", rd.path, adminToken, ""); code != rd.want {
			t.Fatalf("GET %s = %d, want %d", rd.path, code, rd.want)
		}
	}
	for _, path := range []string{"/metrics", "/unloadable-conversations", "/health"} {
		h.do("GET", path, "", "")
	}
	var audited []map[string]any
	for _, l := range buf.lines() {
		if l["message"] == "admin: read served" {
			audited = append(audited, l)
		}
	}
	if len(audited) != len(reads) {
		t.Fatalf("%d admin reads left %d audit lines, want one each: %v", len(reads), len(audited), audited)
	}
	for i, rd := range reads {
		l := audited[i]
		path, query, _ := strings.Cut(rd.path, "?")
		if l["path"] != path || l["query"] != query || l["status"] != float64(rd.want) || l["method"] != "GET" ||
			!strings.HasPrefix(l["remote"].(string), "127.0.0.1:") || l["principal"] != "127.0.0.1/32" || l["level"] != "info" {
			t.Errorf("audit line of GET %s = %v", rd.path, l)
		}
	}
	if strings.Contains(buf.String(), adminToken) {
		t.Error("the log holds the admin token")
	}
}
