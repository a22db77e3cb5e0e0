package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// The probes of issue 18 items 4, 8 and 9, as an attacker runs them:
// through the listeners, with nothing but a socket or an HTTP client.

// do sends a request to the health listener with an optional bearer
// token and Host header, and returns the status and body.
func (h *harness) do(method, path, token, host string) (int, string) {
	h.t.Helper()
	req, err := http.NewRequest(method, "http://"+h.srv.HealthAddr().String()+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if host != "" {
		req.Host = host
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// healthRequest is a request to the health listener, with an optional
// bearer token and Host header, and the status it must get.
type healthRequest struct {
	method, path, token, host string
	want                      int
}

// expectStatuses sends each request and reports every one answered with
// another status.
func (h *harness) expectStatuses(reqs []healthRequest) {
	h.t.Helper()
	for _, r := range reqs {
		if code, body := h.do(r.method, r.path, r.token, r.host); code != r.want {
			h.t.Errorf("%s %s with token %q and Host %q = %d %.60q, want %d", r.method, r.path, r.token, r.host, code, body, r.want)
		}
	}
}

// Item 4: pprof, /debug/pprof/cmdline above all, is served only to the
// admin token, and cmdline never.
func TestExposure_PprofNeedsTheAdminTokenAndNeverServesCmdline(t *testing.T) {
	if _, err := server.New(server.Config{Pprof: true, Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"}); err == nil {
		t.Error("New with pprof and no admin token succeeded, want an error naming admin-token")
	}
	h := start(t, server.Config{Pprof: true, AdminToken: "s3cret"})
	h.expectStatuses([]healthRequest{
		{"GET", "/debug/pprof/goroutine?debug=1", "", "", http.StatusUnauthorized},
		{"GET", "/debug/pprof/goroutine?debug=1", "wrong", "", http.StatusUnauthorized},
		{"GET", "/debug/pprof/goroutine?debug=1", "s3cret", "", http.StatusOK},
		{"GET", "/debug/pprof/cmdline", "", "", http.StatusNotFound},
		{"GET", "/debug/pprof/cmdline", "s3cret", "", http.StatusNotFound},
		{"GET", "/debug/pprof/profile?seconds=3600", "s3cret", "", http.StatusBadRequest},
		{"GET", "/debug/pprof/trace?seconds=61", "s3cret", "", http.StatusBadRequest},
	})
}

// Item 4: refused admin requests are counted and logged, the log rate
// limited, and a token of the right prefix and another length is refused.
func TestExposure_AdminRefusalsCountedAndLoggedRateLimited(t *testing.T) {
	var buf lockedBuffer
	h := start(t, server.Config{AdminToken: "s3cret", Logger: zerolog.New(&buf)})
	const n = 20
	for i := range n {
		tok := []string{"", "wrong", "s3cret2", "s3cre"}[i%4]
		// Past AuthFailureBurst the address is slowed: 429 (authguard_test.go).
		if code, _ := h.do("POST", "/admin/backup", tok, ""); code != http.StatusUnauthorized && !(i >= server.AuthFailureBurst && code == http.StatusTooManyRequests) {
			t.Fatalf("POST /admin/backup with %q = %d, want 401 (429 past the burst)", tok, code)
		}
	}
	if got := h.metric(server.MetricAdminAuthFailures); got != n {
		t.Errorf("%s = %v, want %d", server.MetricAdminAuthFailures, got, n)
	}
	logged := 0
	for _, l := range buf.lines() {
		if strings.HasPrefix(l["message"].(string), "admin request refused") {
			logged++
		}
	}
	if logged < 1 || logged > 3 {
		t.Errorf("%d refused admin requests logged %d lines, want 1 (at most one a second)", n, logged)
	}
	if strings.Contains(buf.String(), "s3cret") {
		t.Error("the log holds a presented token")
	}
}

// Item 4: a page that rebinds its own name to the health listener's
// address gets nothing but /health and /ready.
func TestExposure_HostHeaderCheckedAgainstDNSRebinding(t *testing.T) {
	h := start(t, server.Config{AdminToken: "s3cret", HealthHosts: []string{"participantd.internal"}})
	h.expectStatuses([]healthRequest{
		{"GET", "/metrics", "", "evil.example:7421", http.StatusMisdirectedRequest},
		{"GET", "/unloadable-conversations", "", "evil.example", http.StatusMisdirectedRequest},
		{"GET", "/metrics", "", "localhost:7421", http.StatusOK},
		{"GET", "/metrics", "", "[::1]:7421", http.StatusOK},
		{"GET", "/metrics", "", "participantd.internal:7421", http.StatusOK},
		{"GET", "/ready", "", "evil.example", http.StatusOK},
		{"GET", "/health", "", "evil.example", http.StatusOK},
		{"POST", "/admin/backup", "s3cret", "evil.example", http.StatusMisdirectedRequest},
	})
}

// Item 4: admin or pprof on a health listener beyond loopback answer
// loopback peers only unless asked for (TestAdmin_LoopbackPeersOnly), and
// asked for, only over TLS.
func TestExposure_AdminBeyondLoopbackNeedsAdminRemoteAndTLS(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t, t.TempDir())
	for _, tc := range []struct {
		name string
		cfg  server.Config
		ok   bool
	}{
		{"admin", server.Config{AdminToken: "t"}, true},
		{"admin and pprof", server.Config{AdminToken: "t", Pprof: true}, true},
		{"admin-remote without TLS", server.Config{AdminToken: "t", AdminRemote: true}, false},
		{"admin-remote with TLS", server.Config{AdminToken: "t", AdminRemote: true, HealthTLSCert: certFile, HealthTLSKey: keyFile}, true},
		{"no admin", server.Config{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.DataDir, cfg.Listen, cfg.HealthListen = t.TempDir(), "127.0.0.1:0", "0.0.0.0:0"
			srv, err := server.New(cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New = %v, want ok %v", err, tc.ok)
			}
			if srv != nil {
				// New bound the listeners; Run with a cancelled context
				// closes them.
				ctx, cancel := contextCancelled()
				defer cancel()
				srv.Run(ctx)
			}
		})
	}
}

// Item 4: the health listener serves HTTPS with health-tls-cert, and the
// backup works over it.
func TestExposure_HealthListenerOverTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	h := start(t, server.Config{AdminToken: "s3cret", HealthTLSCert: certFile, HealthTLSKey: keyFile})
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("POST", "https://"+h.srv.HealthAddr().String()+"/admin/backup", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST https://.../admin/backup: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(b) < 4096 {
		t.Errorf("backup over HTTPS = %d, %d bytes", resp.StatusCode, len(b))
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + h.srv.HealthAddr().String() + "/ready"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP /ready answered 200 on a TLS health listener")
		}
	}
}

// Item 9: /unloadable-conversations shows conversation ids only to the
// admin token; without one it shows the count.
func TestExposure_UnloadableIdsOnlyToTheAdminToken(t *testing.T) {
	h := start(t, server.Config{AdminToken: "s3cret"})
	code, body := h.do("GET", "/unloadable-conversations", "", "")
	if code != http.StatusOK || strings.Contains(body, "conversations") {
		t.Errorf("/unloadable-conversations without a token = %d %s, want 200 with the count only", code, body)
	}
	if code, _ := h.do("GET", "/unloadable-conversations", "wrong", ""); code != http.StatusUnauthorized {
		t.Errorf("/unloadable-conversations with a wrong token = %d, want 401", code)
	}
	code, body = h.do("GET", "/unloadable-conversations", "s3cret", "")
	var got map[string]any
	json.Unmarshal([]byte(body), &got)
	if list, ok := got["conversations"].([]any); code != http.StatusOK || !ok || len(list) != 0 {
		t.Errorf("/unloadable-conversations with the token = %d %s, want count 0 and []", code, body)
	}
}

// Item 8: one address holds at most max-connections-per-address
// connections, and opens at most connection-rate a second.
func TestExposure_PerAddressLimits(t *testing.T) {
	t.Run("connections", func(t *testing.T) {
		h := start(t, server.Config{LimitLoopback: true, MaxConnectionsPerAddress: 2, ConnectionRate: 1000})
		a, b := h.dial(), h.dial()
		third := h.dialRaw()
		third.t = t
		third.expectRejected(wire.ReasonOverloaded)
		a.send(&wire.Bye{ID: a.id()})
		a.expectClosed()
		eventually(t, "the address's slot is free again", func() bool {
			c := h.dialRaw()
			c.send(&wire.Hello{Versions: []uint64{1}})
			_, ok := c.next().(*wire.Welcome)
			c.nc.Close()
			return ok
		})
		b.ping()
	})
	t.Run("rate", func(t *testing.T) {
		var buf lockedBuffer
		h := start(t, server.Config{LimitLoopback: true, ConnectionRate: 0.001, Logger: zerolog.New(&buf)})
		a := h.dial()
		const n = 50
		for range n {
			c := h.dialRaw()
			c.t = t
			c.expectRejected(wire.ReasonOverloaded)
		}
		a.ping()
		logged := 0
		for _, l := range buf.lines() {
			if l["message"] == "connection refused" {
				logged++
			}
		}
		if logged >= n {
			t.Errorf("%d refused connections logged %d lines, want them rate limited", n, logged)
		}
	})
	t.Run("loopback exempt by default", func(t *testing.T) {
		h := start(t, server.Config{MaxConnectionsPerAddress: 1, ConnectionRate: 0.001})
		for range 3 {
			h.dial().ping()
		}
	})
}

// Item 8: a connection that holds no binding and does nothing is closed
// with bye{idle}; one that holds a binding is not.
func TestExposure_IdleConnectionClosedWithBye(t *testing.T) {
	h := start(t, server.Config{IdleTimeout: 200 * time.Millisecond})
	bound := h.dial()
	bound.enroll(1)
	idle := h.dial()
	m := idle.next()
	if bye, ok := m.(*wire.ServerBye); !ok || bye.Reason != wire.ByeIdle {
		t.Fatalf("an idle connection got %#v, want bye{idle}", m)
	}
	idle.expectClosed()
	bound.ping()
}

// Item 8: a connection whose enroll was answered in_doubt may hold the
// binding it made (stored, not published until its conversation loads
// again): it holds a binding as bye{idle} means it, so it is not closed
// for idleness, while one that holds nothing is.
func TestExposure_AConnectionWithAnEnrollInDoubtIsNotIdle(t *testing.T) {
	var fs *faultstore.Store
	h := start(t, server.Config{IdleTimeout: 200 * time.Millisecond, WrapStore: func(st store.DurableStore) store.DurableStore {
		fs = faultstore.New(st)
		return fs
	}})
	h.dial().enroll(1)
	// The next enroll's oplog append fails (in doubt), and so does every
	// read of its conversation, so that no reload settles it.
	fs.SetRules(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend, faultstore.OpRead), faultstore.Prefix("oplog/")))
	inDoubt := h.dial()
	if e, ok := inDoubt.call(&wire.Enroll{ID: inDoubt.id(), Conversation: 1, Token: token()}).(*wire.Error); !ok || e.Code != wire.CodeInDoubt {
		t.Fatalf("enroll with a failing oplog append answered %#v, want in_doubt", e)
	}
	// Two idle connections dialed one after the other are closed at least
	// two idle timeouts after the enroll was answered.
	for range 2 {
		idle := h.dial()
		if bye, ok := idle.next().(*wire.ServerBye); !ok || bye.Reason != wire.ByeIdle {
			t.Fatalf("an idle connection got %#v, want bye{idle}", bye)
		}
		idle.expectClosed()
	}
	fs.SetRules()
	inDoubt.ping()
}

// Item 8: a frame whose body is still arriving holds its size of the
// pending budgets, and must arrive within frame-read-timeout.
func TestExposure_FramesBeingReadCountAndHaveADeadline(t *testing.T) {
	const frame = 64 << 10
	h := start(t, server.Config{MaxFrame: frame, MaxRecordBytes: 1024, MaxPendingBytes: frame, MaxPendingBytesTotal: 2 * frame,
		FrameReadTimeout: time.Hour})
	for range 3 {
		c := h.dial()
		c.sendFrameStart(append(header(frame), 0x85))
	}
	eventually(t, "the bodies being read hold the whole pending budget", func() bool {
		return h.metric(server.MetricPendingRequestBytes) == 2*frame
	})

	slow := start(t, server.Config{FrameReadTimeout: 100 * time.Millisecond})
	c := slow.dial()
	c.sendFrameStart(append(header(1000), 0x85))
	c.expectClosed()
}

// Item 8: hello is bounded far below max_frame, and hello.client is
// clipped before it is logged.
func TestExposure_HelloAndClientNameBounded(t *testing.T) {
	var buf lockedBuffer
	h := start(t, server.Config{Logger: zerolog.New(&buf)})
	long := strings.Repeat("x", 8<<10)
	c := h.dialRaw()
	c.send(&wire.Hello{Versions: []uint64{1}, Client: &long})
	if _, ok := c.next().(*wire.Welcome); !ok {
		t.Fatal("hello with an 8 KiB client name refused")
	}
	huge := strings.Repeat("y", 200<<10)
	big := h.dialRaw()
	big.send(&wire.Hello{Versions: []uint64{1}, Client: &huge})
	big.expectRejected(wire.ReasonFrameTooLarge)
	h.shutdown()
	if n := buf.b.Len(); n > 64<<10 {
		t.Errorf("two hellos with long client names grew the log by %d bytes", n)
	}
	if bytes.Contains(buf.b.Bytes(), []byte(strings.Repeat("x", 200))) {
		t.Error("the log holds more than 200 bytes of a client name")
	}
}

// Item 9: with tls-client-ca every connection must present a certificate
// of that CA; a reload serves the renewed certificate to new connections.
func TestExposure_MutualTLSAndReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	clientDir := t.TempDir()
	clientCert, clientKey, _ := selfSigned(t, clientDir)
	h := start(t, server.Config{TLSCert: certFile, TLSKey: keyFile, TLSClientCA: clientCert})
	pair, err := tls.LoadX509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := tls.Dial("tcp", h.srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}); err == nil {
		// TLS 1.3 reports a missing client certificate at the first read.
		nc.SetDeadline(time.Now().Add(waitFor))
		nc.Write(wire.AppendFrame(nil, &wire.Hello{Versions: []uint64{1}}))
		if _, err := nc.Read(make([]byte, 1)); err == nil {
			t.Error("a connection without a client certificate was served")
		}
		nc.Close()
	}
	nc, err := tls.Dial("tcp", h.srv.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatalf("tls.Dial with a client certificate: %v", err)
	}
	c := newClient(t, nc)
	c.send(&wire.Hello{Versions: []uint64{1}})
	if m, ok := c.next().(*wire.Welcome); !ok {
		t.Fatalf("hello with a client certificate answered %#v", m)
	}

	// Renew the server's certificate in place and reload.
	_, _, pool2 := selfSigned(t, dir)
	if err := h.srv.ReloadTLS(); err != nil {
		t.Fatalf("ReloadTLS: %v", err)
	}
	conf := &tls.Config{RootCAs: pool2, ServerName: "127.0.0.1", Certificates: []tls.Certificate{pair}}
	nc2, err := tls.Dial("tcp", h.srv.Addr().String(), conf)
	if err != nil {
		t.Fatalf("after ReloadTLS, a client that trusts only the new certificate: %v", err)
	}
	nc2.Close()
	c.ping()
}

func contextCancelled() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, cancel
}
