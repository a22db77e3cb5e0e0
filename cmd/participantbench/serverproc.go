package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/participantd/participantd/internal/healthwait"
)

// serverProc is a participantd process the bench started on a fresh data
// directory.
type serverProc struct {
	cmd          *exec.Cmd
	args         []string
	dir          string
	addr, health string
	adminToken   string
	stderr       *tailBuffer
	exited       chan struct{}
}

// startServerProc starts bin on a fresh temporary data directory with
// default settings but for loopback listeners, warn-level logs, extra (the
// user's --server-arg) and, with pprof, --pprof and an admin token of the
// bench's; it waits for /ready. For the refused-enrolls workload the
// conversation burst is raised so that filling the connection's cap is not
// rate limited (an --server-arg overrides it).
func startServerProc(ctx context.Context, bin string, extra []string, pprof bool, workload string) (*serverProc, error) {
	dir, err := os.MkdirTemp("", "participantbench-memory-")
	if err != nil {
		return nil, err
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	health, err := freeLoopbackAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	sp := &serverProc{dir: dir, addr: addr, health: health, stderr: &tailBuffer{max: 64 << 10}, exited: make(chan struct{})}
	sp.args = []string{"--listen", addr, "--health-listen", health, "--log-level", "warn"}
	if workload == memRefusedEnrolls {
		sp.args = append(sp.args, "--conversation-burst", "4096")
	}
	sp.args = append(sp.args, extra...)
	env := os.Environ()
	if pprof {
		var b [32]byte
		rand.Read(b[:])
		sp.adminToken = hex.EncodeToString(b[:])
		sp.args = append(sp.args, "--pprof")
		env = append(env, "PARTICIPANTD_ADMIN_TOKEN="+sp.adminToken)
	}
	sp.cmd = exec.Command(bin, append([]string{"--data", dir}, sp.args...)...)
	sp.cmd.Env = env
	sp.cmd.Stderr = sp.stderr
	if err := sp.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		sp.cmd.Wait()
		close(sp.exited)
	}()
	if err := healthwait.Ready(ctx, health, sp.exited, time.Minute); err != nil {
		sp.stop()
		return nil, fmt.Errorf("%s: %w; stderr:\n%s", bin, err, sp.stderr.tail())
	}
	return sp, nil
}

// stop kills the server and removes its data directory.
func (sp *serverProc) stop() {
	sp.cmd.Process.Kill()
	<-sp.exited
	os.RemoveAll(sp.dir)
}

// heapProfile writes the server's heap profile (GET /debug/pprof/heap) to
// path.
func (sp *serverProc) heapProfile(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sp.health+"/debug/pprof/heap", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+sp.adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("heap profile: %s", resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// freeLoopbackAddr returns a loopback TCP address that was free a moment
// ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
