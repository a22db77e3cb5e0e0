package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/participantd/participantd/server"
)

func runForTest(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = run(context.Background(), &env{stdout: &out, stderr: &errb}, args)
	return out.String(), errb.String(), code
}

func TestRun_UsageErrorsAreOneLineAndAPointerToHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"--embedded", "extra"},
	} {
		out, errs, code := runForTest(args...)
		if code != 2 || out != "" {
			t.Errorf("participantbench %s = exit %d, stdout %q; want 2 and nothing", strings.Join(args, " "), code, out)
		}
		lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "participantbench: ") || lines[1] != "participantbench -h describes its flags." {
			t.Errorf("participantbench %s printed\n%s\nwant the error and one line pointing at -h", strings.Join(args, " "), errs)
		}
	}
	// -h prints the whole usage and succeeds.
	if _, errs, code := runForTest("-h"); code != 0 || !strings.HasPrefix(errs, "usage: participantbench ") || !strings.Contains(errs, "-etcd-compare") {
		t.Errorf("-h = exit %d, %q; want 0 and the usage with its flags", code, errs)
	}
}

func TestRun_Version(t *testing.T) {
	out, errs, code := runForTest("--version")
	if code != 0 || errs != "" || !strings.HasPrefix(out, "participantbench ") || !strings.Contains(out, server.Version) {
		t.Errorf("--version = exit %d, stdout %q, stderr %q; want 0 and the build with protocol %s", code, out, errs, server.Version)
	}
}
