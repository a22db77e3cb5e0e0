// Package daemontest is what the tests that run the participantd binary
// as a real process share (cmd/participantd/e2e, robustness,
// deploy/kubernetes): its build, free loopback addresses to give it, and
// the wait for its /ready. Each test keeps its own process handling: how
// it starts, signals and judges the process is what it tests.
package daemontest

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/internal/freeport"
	"github.com/participantd/participantd/internal/healthwait"
)

// module is the import path of the project's module.
const module = "github.com/participantd/participantd"

// ErrExited reports a process that ended before its /ready answered.
var ErrExited = healthwait.ErrExited

// Build builds participantd into dir with the build tags given (faulthook:
// the test hook of cmd/participantd/faulthook.go) and returns the binary's
// path. Its error holds the compiler's output.
func Build(dir string, tags ...string) (string, error) {
	return BuildCommand(dir, "participantd", tags...)
}

// BuildCommand builds the project's command cmd/name (participantd,
// participantctl) into dir with the build tags given and returns the
// binary's path. Its error holds the compiler's output.
func BuildCommand(dir, name string, tags ...string) (string, error) {
	bin := filepath.Join(dir, name)
	pkg := module + "/cmd/" + name
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// FreeAddr returns a loopback address that was free a moment ago, below
// the kernel's ephemeral range, where no outgoing connection can take it
// before the daemon binds it (freeport).
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// WaitReady polls GET /ready of the health listener at addr until it
// answers 200 (nil), exited is closed (ErrExited; a nil exited is never
// closed), or timeout passes (healthwait.Ready).
func WaitReady(addr string, exited <-chan struct{}, timeout time.Duration) error {
	return healthwait.Ready(context.Background(), addr, exited, timeout)
}
