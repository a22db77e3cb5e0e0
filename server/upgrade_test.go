package server_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/participantd/participantd/internal/daemontest"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// Golden data directories of earlier releases (server/testdata/upgrade/):
// each was written by that release's participantd running upgradeWorkload,
// then killed with SIGKILL, so that its write-ahead log still holds rows
// the checkpoint has not taken. Beside the directory, exchange.frames holds
// every request the workload sent and the answer it got, as frames.
// TestUpgrade_EarlierFormatsOpenAndServe opens each with this build and
// requires what an upgraded operator's clients rely on: every answer
// replays as it was given, every record told is delivered to its
// recipients with its payload, and the conversation takes new work.
//
// To add the directory of a release (docs/operations.md, "Upgrading"):
//
//	git worktree add /tmp/old vX.Y.Z && (cd /tmp/old && go build -o /tmp/participantd-old ./cmd/participantd)
//	go test ./server -run TestUpgrade_Generate -upgrade-generate=/tmp/participantd-old -upgrade-name=vX.Y.Z
var (
	upgradeGenerate = flag.String("upgrade-generate", "", "write server/testdata/upgrade/<-upgrade-name> with this participantd binary")
	upgradeName     = flag.String("upgrade-name", "", "the golden directory's name (the release)")
)

const upgradeDir = "testdata/upgrade"

// upgradeSettings are the generator's flags beyond the addresses: a
// receipt TTL and a retention far beyond any test's life, so that every
// answer still replays in full years from now, and checkpoints every few
// rows, so that the file holds checkpoints beside the log's rows.
var upgradeSettings = []string{"--receipt-ttl", "876000h", "--retain", "876000h", "--checkpoint-rows", "16"}

// exchange is one request and the answer the release gave it.
type exchange struct {
	req    wire.Message
	answer wire.Message
}

// upgradeWorkload runs a fixed workload over fresh connections to addr and
// returns every request with its answer. It covers each request type and
// its records: enrolls into three conversations, tells from several
// participants, acks, an attach that supersedes a binding, a detach, a
// leave (conversation 3 left by all), and a long conversation that is
// checkpointed several times.
func upgradeWorkload(t *testing.T, addr string) []exchange {
	var log []exchange
	dial := func() *client {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c := newClient(t, nc)
		c.send(&wire.Hello{Versions: []uint64{1}})
		if _, ok := c.next().(*wire.Welcome); !ok {
			t.Fatal("no welcome")
		}
		return c
	}
	call := func(c *client, m wire.Message) wire.Message {
		a := c.call(m)
		log = append(log, exchange{m, a})
		return a
	}
	enroll := func(c *client, conv uint64) cred {
		e, ok := call(c, &wire.Enroll{ID: c.id(), Conversation: conv, Token: token()}).(*wire.Enrolled)
		if !ok {
			t.Fatal("enroll refused")
		}
		return cred{conv, e.Participant, e.Generation, e.Secret}
	}
	tell := func(c *client, cr cred, payload string) uint64 {
		told, ok := call(c, &wire.Tell{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte(payload)}).(*wire.Told)
		if !ok {
			t.Fatal("tell refused")
		}
		return told.Seq
	}
	ack := func(c *client, cr cred, through uint64) {
		if _, ok := call(c, &wire.Ack{ID: c.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Through: through}).(*wire.Acked); !ok {
			t.Fatal("ack refused")
		}
	}

	a, b, c3 := dial(), dial(), dial()
	alice := enroll(a, 1)
	bob := enroll(b, 1)
	var last uint64
	for i := range 20 {
		last = tell(a, alice, fmt.Sprintf("transfer %d to bob", 100+i))
	}
	ack(b, bob, last)
	tell(b, bob, "thanks, alice")
	// Bob moves to another connection: attach supersedes his binding.
	at, ok := call(c3, &wire.Attach{ID: c3.id(), Conversation: 1, Participant: bob.p, Generation: bob.gen, Secret: bob.secret, Token: token()}).(*wire.Attached)
	if !ok {
		t.Fatal("attach refused")
	}
	bob = cred{1, at.Participant, at.Generation, at.Secret}
	tell(c3, bob, "bob, from his second connection")
	if _, ok := call(a, &wire.Detach{ID: a.id(), Conversation: 1, Participant: alice.p, Generation: alice.gen, Token: token()}).(*wire.Detached); !ok {
		t.Fatal("detach refused")
	}

	// Conversation 2: long enough for several checkpoints.
	d, e := dial(), dial()
	carol, dave := enroll(d, 2), enroll(e, 2)
	for i := range 60 {
		s := tell(d, carol, fmt.Sprintf("carol %03d", i))
		if i%3 == 0 {
			tell(e, dave, fmt.Sprintf("dave %03d", i))
		}
		if i%10 == 9 {
			ack(e, dave, s)
		}
	}

	// Conversation 3: everyone leaves.
	f := dial()
	erin := enroll(f, 3)
	tell(f, erin, "erin says goodbye")
	if _, ok := call(f, &wire.Leave{ID: f.id(), Conversation: 3, Participant: erin.p, Generation: erin.gen, Secret: erin.secret, Token: token()}).(*wire.Left); !ok {
		t.Fatal("leave refused")
	}
	return log
}

// TestUpgrade_Generate writes a golden directory with the binary named by
// -upgrade-generate; without it there is nothing to do.
func TestUpgrade_Generate(t *testing.T) {
	if *upgradeGenerate == "" {
		t.Skip("writes a golden directory only when given -upgrade-generate and -upgrade-name")
	}
	if *upgradeName == "" {
		t.Fatal("-upgrade-name names the directory")
	}
	data := t.TempDir()
	addr, health := daemontest.FreeAddr(t), daemontest.FreeAddr(t)
	cmd := exec.Command(*upgradeGenerate, append([]string{"--data", data, "--listen", addr, "--health-listen", health}, upgradeSettings...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	exited := make(chan struct{})
	go func() {
		cmd.Wait() // killed below: its error says so
		close(exited)
	}()
	if err := daemontest.WaitReady(health, exited, 30*time.Second); err != nil {
		t.Fatalf("%s: %v", *upgradeGenerate, err)
	}
	log := upgradeWorkload(t, addr)
	// Every answer was durable before it was sent: a SIGKILL loses none,
	// and leaves the log's tail for the new build to replay.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited

	dir := filepath.Join(upgradeDir, *upgradeName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var frames bytes.Buffer
	w := wire.NewWriter(&frames, min(1<<31, math.MaxInt))
	for _, x := range log {
		if err := w.WriteMessage(x.req); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteMessage(x.answer); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "exchange.frames"), frames.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tarGz(data, filepath.Join(dir, "data.tar.gz")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(*upgradeGenerate, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", *upgradeGenerate, err)
	}
	readme := fmt.Sprintf("Written by TestUpgrade_Generate (server/upgrade_test.go) with\n%s\nsettings: %s\n", strings.TrimSpace(string(out)), strings.Join(upgradeSettings, " "))
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestUpgrade_EarlierFormatsOpenAndServe(t *testing.T) {
	entries, err := os.ReadDir(upgradeDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("no golden directories")
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) { testUpgrade(t, filepath.Join(upgradeDir, e.Name())) })
	}
}

func testUpgrade(t *testing.T, golden string) {
	data := t.TempDir()
	if err := untarGz(filepath.Join(golden, "data.tar.gz"), data); err != nil {
		t.Fatal(err)
	}
	log := readExchange(t, filepath.Join(golden, "exchange.frames"))
	cfg := server.Config{DataDir: data, ReceiptTTL: 876000 * time.Hour, Retain: 876000 * time.Hour}
	h := start(t, cfg)

	// 1. Every request replays its answer, on a fresh connection, as if
	// its client had lost the answer across the upgrade.
	c := h.dial()
	ignore := cmp.Options{
		cmpopts.IgnoreFields(wire.Enrolled{}, "ID", "Replay"), cmpopts.IgnoreFields(wire.Attached{}, "ID", "Replay"),
		cmpopts.IgnoreFields(wire.Told{}, "ID", "Replay"), cmpopts.IgnoreFields(wire.Detached{}, "ID", "Replay"),
		cmpopts.IgnoreFields(wire.Left{}, "ID", "Replay"), cmpopts.IgnoreFields(wire.Acked{}, "ID", "Noop"),
	}
	creds := map[[2]uint64]cred{}
	left := map[[2]uint64]bool{}
	told := map[uint64]map[uint64]*wire.Tell{} // conversation → seq → tell
	// An enroll's or attach's answer whose credential a later attach of
	// the same participant superseded no longer replays its secret: that
	// retry is receipt_expired (docs/PROTOCOL.md, Replays), in the release
	// as in this build.
	superseded := map[int]bool{}
	for i, x := range log {
		k, ok := credentialOf(x.answer)
		if !ok {
			continue
		}
		for _, y := range log[i+1:] {
			if at, ok := y.answer.(*wire.Attached); ok && [2]uint64{at.Conversation, at.Participant} == k {
				superseded[i] = true
			}
		}
	}
	for i, x := range log {
		switch req := x.req.(type) {
		case *wire.Ack:
			// An ack is no token operation: a repeat is a noop or a
			// regression, so it is not replayed here.
			continue
		case *wire.Enroll:
			req.ID = c.id()
		case *wire.Attach:
			req.ID = c.id()
		case *wire.Tell:
			req.ID = c.id()
		case *wire.Detach:
			req.ID = c.id()
		case *wire.Leave:
			req.ID = c.id()
		}
		got := c.call(x.req)
		if superseded[i] {
			if e, ok := got.(*wire.Error); !ok || e.Code != wire.CodeReceiptExpired {
				t.Errorf("replay of a superseded %T answered %#v, want receipt_expired", x.req, got)
			}
		} else if diff := cmp.Diff(x.answer, got, ignore); diff != "" {
			t.Errorf("replay of %T (-release +this build):\n%s", x.req, diff)
		}
		switch a := x.answer.(type) {
		case *wire.Enrolled:
			creds[[2]uint64{a.Conversation, a.Participant}] = cred{a.Conversation, a.Participant, a.Generation, a.Secret}
		case *wire.Attached:
			creds[[2]uint64{a.Conversation, a.Participant}] = cred{a.Conversation, a.Participant, a.Generation, a.Secret}
		case *wire.Left:
			left[[2]uint64{a.Conversation, a.Participant}] = true
		case *wire.Told:
			req := x.req.(*wire.Tell)
			if told[a.Conversation] == nil {
				told[a.Conversation] = map[uint64]*wire.Tell{}
			}
			told[a.Conversation][a.Seq] = req
		}
	}

	// 2. Every participant still joined attaches with its last credential
	// and is delivered every record told by another above its cursor,
	// with the payload told; then each tells once more.
	checked := 0
	for k, cr := range creds {
		if left[k] {
			continue
		}
		pc := h.dial()
		at, ok := pc.call(&wire.Attach{ID: pc.id(), Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Secret: cr.secret, Token: token()}).(*wire.Attached)
		if !ok {
			t.Fatalf("conversation %d: participant %d cannot attach with its last credential", cr.conv, cr.p)
		}
		got := cred{cr.conv, cr.p, at.Generation, at.Secret}
		want := map[uint64]string{}
		for seq, tl := range told[cr.conv] {
			if tl.Participant != cr.p && seq > at.Cursor {
				want[seq] = string(tl.Payload)
			}
		}
		checked += len(want)
		for len(want) > 0 {
			d := pc.delivery()
			if d.Conversation != cr.conv || d.Recipient != cr.p {
				continue
			}
			if p, ok := want[d.Seq]; ok && d.Kind == wire.KindRecord {
				if string(d.Payload) != p {
					t.Errorf("conversation %d seq %d delivered %q to participant %d, told %q", cr.conv, d.Seq, d.Payload, cr.p, p)
				}
				delete(want, d.Seq)
			}
			a := pc.call(&wire.Ack{ID: pc.id(), Conversation: cr.conv, Participant: cr.p, Generation: got.gen, Through: d.Seq})
			if _, ok := a.(*wire.Acked); !ok {
				t.Fatalf("ack through %d answered %#v", d.Seq, a)
			}
		}
		pc.tell(got, "after the upgrade")
	}

	if checked < 10 {
		t.Errorf("%d told records were left to deliver after the upgrade, want the workload's unacknowledged ones (at least 10)", checked)
	}

	// 3. The upgraded directory opens again after a clean stop.
	if err := h.shutdown(); err != nil {
		t.Fatalf("drain: %v", err)
	}
	h2 := start(t, cfg)
	h2.dial().ping()
}

// credentialOf returns the conversation and participant of an enroll's or
// attach's answer.
func credentialOf(m wire.Message) ([2]uint64, bool) {
	switch a := m.(type) {
	case *wire.Enrolled:
		return [2]uint64{a.Conversation, a.Participant}, true
	case *wire.Attached:
		return [2]uint64{a.Conversation, a.Participant}, true
	}
	return [2]uint64{}, false
}

func readExchange(t *testing.T, path string) []exchange {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := wire.NewReader(bufio.NewReader(bytes.NewReader(b)), min(1<<31, math.MaxInt))
	var log []exchange
	for {
		reqBody, err := r.ReadFrame()
		if errors.Is(err, io.EOF) {
			return log
		}
		if err != nil {
			t.Fatal(err)
		}
		// The reader reuses its buffer: decode before the next frame.
		req, err := wire.DecodeRequest(reqBody)
		if err != nil {
			t.Fatal(err)
		}
		ansBody, err := r.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		ans, err := wire.DecodeServerMessage(ansBody)
		if err != nil {
			t.Fatal(err)
		}
		log = append(log, exchange{req, ans})
	}
}

// tarGz writes dir's regular files and directories to path.
func tarGz(dir, path string) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = rel
		hdr.ModTime = time.Unix(0, 0)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func untarGz(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.Clean(hdr.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("%s: member %q outside the directory", path, hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return err
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if err := os.WriteFile(p, b, os.FileMode(hdr.Mode)&0o600); err != nil {
				return err
			}
		}
	}
}
