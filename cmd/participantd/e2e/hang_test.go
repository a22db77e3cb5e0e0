package e2e_test

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/participantd/participantd/wire"
)

// TestSIGTERM_HungStoreExitsWithinBound runs the binary built with the
// faulthook test hook, makes every store flush hang from a SIGUSR1 on (a
// dead disk), and sends SIGTERM with a tell stuck in a flush: the process
// exits 1 within --drain-timeout + --store-close-timeout, having logged at
// error level the flush it gave up on, and the data directory then starts
// again and reconciles.
func TestSIGTERM_HungStoreExitsWithinBound(t *testing.T) {
	bin := buildBinary(t, "faulthook")
	dir := t.TempDir()
	const bound = 300*time.Millisecond + 700*time.Millisecond
	p := startProc(t, bin, dir, "PARTICIPANTD_DRAIN_TIMEOUT=300ms", "PARTICIPANTD_STORE_CLOSE_TIMEOUT=700ms")
	c := dial(t, p.addr)
	cr := c.enroll(1)

	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	// The hook arms asynchronously: tell until one is not answered.
	for stuck := false; !stuck; {
		ch, err := c.start(func(id uint64) wire.Message {
			return &wire.Tell{ID: id, Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte("x")}
		})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ch:
			if _, ok := m.(*wire.Told); !ok {
				t.Fatalf("tell before the hang answered %#v", m)
			}
		case <-time.After(500 * time.Millisecond):
			stuck = true
		}
	}

	began := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(waitFor):
		t.Fatalf("participantd did not exit within %v of SIGTERM with a hung store", waitFor)
	}
	took := time.Since(began)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("participantd exited with %v, want status 1", err)
	}
	// Generous: the bound plus a loaded machine's scheduling.
	if took < bound || took > bound+5*time.Second {
		t.Errorf("participantd exited %v after SIGTERM, want about %v", took, bound)
	}
	logs := p.stderr.String()
	var line string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"message":"the store stopped answering`) {
			line = l
		}
	}
	for _, want := range []string{`"level":"error"`, `"store_call":"Flush"`} {
		if !strings.Contains(line, want) {
			t.Errorf("give-up log line %q lacks %s; stderr:\n%s", line, want, logs)
		}
	}
	checkLogs(t, p.stderr)

	// The disk is back (a new process, no SIGUSR1): it opens, reconciles
	// and serves the participant.
	p2 := startProc(t, bin, dir)
	c2 := dial(t, p2.addr)
	c2.attach(cr)
}
