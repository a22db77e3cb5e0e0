package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Issue 27 item 4: without admin-remote the admin endpoints answer
// loopback peers only, so that a health listener beyond loopback serves
// probes and metrics to the network and the admin token's powers to the
// host (or the pod) alone; with it, every peer with the token.
func TestAdmin_LoopbackPeersOnly(t *testing.T) {
	const tok = "Xq3v9LzT0bWk7RmN2pYs4HcJ8dFg1aEu"
	for _, tc := range []struct {
		remote      string
		adminRemote bool
		want        int
	}{
		{"127.0.0.1:5000", false, http.StatusServiceUnavailable}, // admitted; the service is not open
		{"[::1]:5000", false, http.StatusServiceUnavailable},
		{"10.1.2.3:5000", false, http.StatusForbidden},
		{"[2001:db8::1]:5000", false, http.StatusForbidden},
		{"[::ffff:127.0.0.1]:5000", false, http.StatusServiceUnavailable},
		{"10.1.2.3:5000", true, http.StatusServiceUnavailable},
	} {
		s, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0", AdminToken: tok, AdminRemote: tc.adminRemote})
		if err != nil {
			t.Fatal(err)
		}
		h := s.healthHandler()
		for _, path := range []string{"/admin/conversations/1", "/unloadable-conversations"} {
			req := httptest.NewRequest("GET", "http://127.0.0.1"+path, nil)
			req.RemoteAddr = tc.remote
			req.Header.Set("Authorization", "Bearer "+tok)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Errorf("GET %s from %s, admin-remote %v = %d, want %d", path, tc.remote, tc.adminRemote, rec.Code, tc.want)
			}
		}
		s.closeListeners()
		s.hln.Close()
	}
}
