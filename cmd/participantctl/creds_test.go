package main

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/wire"
)

// cutProxy forwards connections to a server until the server answers with
// a frame of type drop: that frame is swallowed and nothing more reaches
// the client, as when participantctl dies after the server committed and
// before the answer arrived. dropped is closed then.
type cutProxy struct {
	ln      net.Listener
	dropped chan struct{}
	once    sync.Once

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target, drop string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, dropped: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(s, c) }()
			go func() { defer p.wg.Done(); p.serverToClient(s, c, drop) }()
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) serverToClient(s, c net.Conn, drop string) {
	r, w := wire.NewReader(s, 0), wire.NewWriter(c, 0)
	for {
		body, err := r.ReadFrame()
		if err != nil {
			return
		}
		if m, err := wire.DecodeServerMessage(body); err == nil && m.Type() == drop {
			p.once.Do(func() { close(p.dropped) })
			io.Copy(io.Discard, s) // forward nothing more
			return
		}
		if err := w.WriteFrame(body); err != nil {
			return
		}
	}
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func readCredsFileT(t *testing.T, path string) credsFile {
	t.Helper()
	f, err := readCredsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAttach_DiedAfterCommit_NextRunRecovers cuts an attach after the
// server committed it and before its answer reached participantctl: the
// next run must replay it from the token saved in the credential file and
// go on, where a fresh token would meet stale_authority for good.
func TestAttach_DiedAfterCommit_NextRunRecovers(t *testing.T) {
	ctx := testCtx(t)
	addr, _ := startServer(t, t.TempDir())
	creds := filepath.Join(t.TempDir(), "p.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "5", "--creds", creds)
	before := readCredsFileT(t, creds)

	proxy := newCutProxy(t, addr, wire.TypeAttached)
	if _, _, code := ctl(ctx, "", "attach", "--addr", proxy.addr(), "--creds", creds, "--timeout", "500ms"); code == 0 {
		t.Fatal("attach through the cutting proxy succeeded, want it to time out")
	}
	select {
	case <-proxy.dropped:
	default:
		t.Fatal("the server never answered attached: nothing committed, nothing to recover")
	}
	proxy.close()
	mid := readCredsFileT(t, creds)
	if mid.pending == nil || mid.pending.op != client.IntentAttach || mid.cred != before.cred {
		t.Fatalf("credential file after the cut = %+v pending %+v, want the old credential and the attach's token", mid.cred, mid.pending)
	}

	out := mustCtl(t, ctx, "attach", "--addr", addr, "--creds", creds)
	after := readCredsFileT(t, creds)
	// Generation 2 was minted by the cut attach (replayed), 3 by the
	// attach that binds this run.
	if after.pending != nil || after.cred.Generation != before.cred.Generation+2 {
		t.Errorf("credential after recovery = %v pending %+v, want generation %d and nothing pending", after.cred, after.pending, before.cred.Generation+2)
	}
	if !strings.Contains(out, "attached") {
		t.Errorf("attach output = %q", out)
	}
	// And the participant keeps working.
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", creds, "hello")
}

// TestEnroll_DiedAfterCommit_RerunRecoversTheSameParticipant: an enroll
// cut after it committed is finished by re-running it, which replays the
// participant it created instead of enrolling a second one.
func TestEnroll_DiedAfterCommit_RerunRecoversTheSameParticipant(t *testing.T) {
	ctx := testCtx(t)
	addr, _ := startServer(t, t.TempDir())
	creds := filepath.Join(t.TempDir(), "p.json")
	proxy := newCutProxy(t, addr, wire.TypeEnrolled)
	if _, _, code := ctl(ctx, "", "enroll", "--addr", proxy.addr(), "--conversation", "9", "--creds", creds, "--timeout", "500ms"); code == 0 {
		t.Fatal("enroll through the cutting proxy succeeded, want it to time out")
	}
	proxy.close()
	if f := readCredsFileT(t, creds); f.pending == nil || f.pending.op != client.IntentEnroll {
		t.Fatalf("credential file after the cut: pending %+v, want the enroll's token", f.pending)
	}
	if _, errs, code := ctl(ctx, "", "tell", "--addr", addr, "--creds", creds, "x"); code == 0 || !strings.Contains(errs, "re-run enroll") {
		t.Errorf("tell with a pending enroll = %d, %q; want a refusal saying to re-run enroll", code, errs)
	}
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "9", "--creds", creds)
	f := readCredsFileT(t, creds)
	if f.pending != nil || f.cred.Participant != 0 || f.cred.Conversation != 9 {
		t.Errorf("credential after re-running enroll = %v pending %+v, want participant 0 of conversation 9", f.cred, f.pending)
	}
	other := filepath.Join(t.TempDir(), "q.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "9", "--creds", other)
	if g := readCredsFileT(t, other); g.cred.Participant != 1 {
		t.Errorf("next enroll got participant %d, want 1: the re-run must not have enrolled twice", g.cred.Participant)
	}
}

func TestCredsFile_RoundTripAndOldFormat(t *testing.T) {
	cred := client.Credential{Conversation: 4, Participant: 2, Generation: 7}
	cred.Secret[0] = 9
	tok := client.NewToken()
	for _, f := range []credsFile{
		{cred: cred},
		{cred: cred, pending: &pendingIntent{op: client.IntentAttach, token: tok}},
		{cred: client.Credential{Conversation: 4}, pending: &pendingIntent{op: client.IntentEnroll, token: tok}},
	} {
		b, err := f.marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseCreds("f", b)
		if err != nil {
			t.Fatalf("parseCreds(%s) = %v", b, err)
		}
		if got.cred != f.cred || (got.pending == nil) != (f.pending == nil) || (got.pending != nil && *got.pending != *f.pending) {
			t.Errorf("round trip of %s = %+v %+v", b, got.cred, got.pending)
		}
	}
	// A file written before pending existed is the credential alone.
	old, err := json.Marshal(cred)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := parseCreds("f", old); err != nil || got.cred != cred || got.pending != nil {
		t.Errorf("parseCreds(old format) = %+v, %v", got, err)
	}
	for _, bad := range []string{
		`{"conversation":1,"pending":{"op":"enroll","token":"00"}}`,
		`{"conversation":1,"pending":{"op":"tell","token":"0102030405060708090a0b0c0d0e0f10"}}`,
		`{"conversation":1,"participant":0,"generation":1,"secret":"` + strings.Repeat("0", 64) + `","pending":{"op":"enroll","token":"0102030405060708090a0b0c0d0e0f10"}}`,
	} {
		if _, err := parseCreds("f", []byte(bad)); err == nil {
			t.Errorf("parseCreds(%s) = nil error", bad)
		}
	}
}

// TestAttach_PendingReplayExpired_SaysTheCredentialIsLost: when the cut
// attach's answer can no longer be replayed (receipt_ttl passed), the next
// run says plainly that the credential is lost, and keeps the file as it
// was.
func TestAttach_PendingReplayExpired_SaysTheCredentialIsLost(t *testing.T) {
	ctx := testCtx(t)
	// A receipt TTL of 1ns: every replay of a secret-bearing answer is
	// past its deadline.
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir(), ReceiptTTL: time.Nanosecond})
	addr := srv.Addr().String()
	creds := filepath.Join(t.TempDir(), "p.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "5", "--creds", creds)
	proxy := newCutProxy(t, addr, wire.TypeAttached)
	if _, _, code := ctl(ctx, "", "attach", "--addr", proxy.addr(), "--creds", creds, "--timeout", "500ms"); code == 0 {
		t.Fatal("attach through the cutting proxy succeeded")
	}
	proxy.close()
	before, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	_, errs, code := ctl(ctx, "", "attach", "--addr", addr, "--creds", creds)
	if code != 1 || !strings.Contains(errs, "receipt_expired") || !strings.Contains(errs, "no longer replays") {
		t.Errorf("attach with an expired pending replay = exit %d, %q; want 1 and the credential declared lost", code, errs)
	}
	if after, _ := os.ReadFile(creds); string(after) != string(before) {
		t.Errorf("credential file changed by the failed recovery:\n%s\nwas\n%s", after, before)
	}
}
