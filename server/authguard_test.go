package server_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

const adminToken = "Xq3v9LzT0bWk7RmN2pYs4HcJ8dFg1aEu"

// Issue 27 item 4: 300 wrong admin tokens are neither unlimited nor
// silent. The first AuthFailureBurst are compared and refused 401, the
// rest 429 uncompared, the right token with them while the allowance is
// spent, and every one is counted by cause.
func TestAuthGuard_WrongAdminTokensAreSlowed(t *testing.T) {
	h := start(t, server.Config{AdminToken: adminToken})
	var unauthorized, throttled int
	began := time.Now()
	for i := range 300 {
		switch code, _ := h.do("POST", "/admin/backup", "wrong-"+strings.Repeat("x", i%7), ""); code {
		case http.StatusUnauthorized:
			unauthorized++
		case http.StatusTooManyRequests:
			throttled++
		default:
			t.Fatalf("wrong admin token %d = %d, want 401 or 429", i, code)
		}
	}
	// An allowance refills one attempt an interval: a slow run sees one
	// more compared for each interval it took, never the 300.
	refills := int(time.Since(began) / server.AuthFailureInterval)
	if unauthorized < server.AuthFailureBurst || unauthorized > server.AuthFailureBurst+refills || unauthorized+throttled != 300 {
		t.Errorf("300 wrong admin tokens: %d compared (401), %d throttled (429); want %d compared, plus at most %d refilled",
			unauthorized, throttled, server.AuthFailureBurst, refills)
	}
	if code, _ := h.do("GET", "/admin/conversations/1", adminToken, ""); code != http.StatusTooManyRequests {
		t.Errorf("the right token while the address is throttled = %d, want 429 (refused before comparing)", code)
	}
	if got := h.metric(server.MetricAuthFailures + `{cause="wrong_token",listener="admin"}`); got != float64(unauthorized) {
		t.Errorf("wrong_token = %v, want %d", got, unauthorized)
	}
	if got := h.metric(server.MetricAuthFailures + `{cause="throttled",listener="admin"}`); got != float64(throttled+1) {
		t.Errorf("throttled = %v, want %d", got, throttled+1)
	}
}

// Wrong auth tokens in hello are slowed the same way, and the refusal
// says why.
func TestAuthGuard_WrongAuthTokensAreSlowed(t *testing.T) {
	h := start(t, server.Config{AuthToken: adminToken})
	for i := range server.AuthFailureBurst + 3 {
		c := h.dialRaw()
		c.send(&wire.Hello{Versions: []uint64{1}, Auth: authOf("wrong")})
		m := c.next()
		rj, ok := m.(*wire.Rejected)
		if !ok || rj.Reason != wire.ReasonAuthFailed {
			t.Fatalf("hello %d with a wrong token = %#v, want rejected{auth_failed}", i, m)
		}
		if throttled := strings.Contains(rj.Detail, "too many"); throttled != (i >= server.AuthFailureBurst) {
			t.Errorf("hello %d with a wrong token: detail %q", i, rj.Detail)
		}
		c.nc.Close()
	}
	c := h.dialRaw()
	c.send(&wire.Hello{Versions: []uint64{1}, Auth: authOf(adminToken)})
	if rj, ok := c.next().(*wire.Rejected); !ok || !strings.Contains(rj.Detail, "too many") {
		t.Errorf("the right token while throttled was not refused before the compare")
	}
	c.nc.Close()
	label := "wire"
	if h.overWS() {
		label = "ws"
	}
	if got := h.metric(server.MetricAuthFailures + `{cause="wrong_token",listener="` + label + `"}`); got != server.AuthFailureBurst {
		t.Errorf("wrong_token = %v, want %d", got, server.AuthFailureBurst)
	}
}
