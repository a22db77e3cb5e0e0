package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startServer runs an in-process participantd on dir and returns its
// address and a function that stops it (idempotent, also run at cleanup).
func startServer(t *testing.T, dir string) (string, func()) {
	t.Helper()
	srv := servertest.Start(t, server.Config{DataDir: dir})
	return srv.Addr().String(), func() { srv.Stop() }
}

// ctl runs participantctl in process and returns its stdout, stderr and
// exit status.
func ctl(ctx context.Context, stdin string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	code := run(ctx, e, args)
	return out.String(), errb.String(), code
}

func mustCtl(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, errs, code := ctl(ctx, "", args...)
	if code != 0 {
		t.Fatalf("participantctl %s = exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func TestOnline_EnrollTellTailAckLeave(t *testing.T) {
	ctx := testCtx(t)
	data := t.TempDir()
	addr, stop := startServer(t, data)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")

	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "42", "--creds", a)
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "42", "--creds", b)
	if _, errs, code := ctl(ctx, "", "enroll", "--addr", addr, "--conversation", "42", "--creds", a); code == 0 || !strings.Contains(errs, "--force") {
		t.Errorf("enroll over an existing file = %d, %q; want a refusal naming --force", code, errs)
	}
	credA := readCredsT(t, a)
	if credA.Generation != 1 {
		t.Errorf("after enroll generation = %d, want 1", credA.Generation)
	}

	tok := client.NewToken().String()
	seq := toldSeq(t, mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "--token", tok, "hello world"))
	if again := toldSeq(t, mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "--token", tok, "hello world")); again != seq {
		t.Errorf("tell with the same token = %s, want the original seq %s", again, seq)
	}
	if g := readCredsT(t, a).Generation; g != 3 {
		t.Errorf("after two tells generation = %d, want 3 (each attaches)", g)
	}
	out, errs, code := ctl(ctx, "\x00\x01binary", "tell", "--addr", addr, "--creds", a, "-")
	if code != 0 {
		t.Fatalf("tell - = %d: %s", code, errs)
	}
	binSeq := toldSeq(t, out)

	// b follows a's two records. (How many lifecycle events come before
	// them varies: a's enroll ends its binding when that command's bye is
	// processed, which may be before or after b enrolls.)
	out = mustCtl(t, ctx, "tail", "--addr", addr, "--creds", b, "--json", "--records-only", "--count", "2")
	var lines []deliveryJSON
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var d deliveryJSON
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("tail --json line %q: %v", l, err)
		}
		lines = append(lines, d)
	}
	var sawText, sawBin bool
	for i, d := range lines {
		if i > 0 && d.Seq <= lines[i-1].Seq {
			t.Errorf("tail seqs not ascending: %+v", lines)
		}
		if d.Kind == "record" && d.Payload == "hello world" && strings.TrimSpace(seq) == itoa(d.Seq) {
			sawText = true
		}
		if d.Kind == "record" && d.PayloadHex == "000162696e617279" && binSeq == itoa(d.Seq) {
			sawBin = true
		}
	}
	if !sawText || !sawBin {
		t.Errorf("tail = %+v, want the text record %s and the binary one %s", lines, seq, binSeq)
	}
	if out := mustCtl(t, ctx, "ack", "--addr", addr, "--creds", b, "--through", binSeq); out != "acked: conversation 42 participant 1 cursor "+binSeq+"\n" {
		t.Errorf("ack = %q, want cursor %s (tail acknowledged it already)", out, binSeq)
	}
	if out := mustCtl(t, ctx, "leave", "--addr", addr, "--creds", a); !strings.HasPrefix(out, "left: conversation 42 participant 0 seq ") {
		t.Errorf("leave = %q", out)
	}
	if _, errs, code := ctl(ctx, "", "tell", "--addr", addr, "--creds", a, "x"); code != 1 || !strings.Contains(errs, "retired") {
		t.Errorf("tell after leave = %d, %q; want retired", code, errs)
	}

	// inspect refuses a running server's data.
	if _, errs, code := ctl(ctx, "", "inspect", "--data", data); code != 1 || !strings.Contains(errs, "locked") {
		t.Errorf("inspect on a running server = %d, %q; want the lock error", code, errs)
	}
	stop()
	var rep inspectReport
	if err := json.Unmarshal([]byte(mustCtl(t, ctx, "inspect", "--data", data, "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Conversations) != 1 || len(rep.Conversations[0].Participants) != 2 {
		t.Fatalf("inspect = %+v, want conversation 42 with 2 participants", rep)
	}
	c := rep.Conversations[0]
	if c.Conversation != 42 || !c.Participants[0].Retired || c.Participants[1].Retired || c.Participants[1].Cursor == 0 || c.Refused != nil {
		t.Errorf("inspect conversation = %+v", c)
	}
	if out := mustCtl(t, ctx, "verify", "--data", data); out != "conversation 42: ok\n" {
		t.Errorf("verify = %q", out)
	}
}

func itoa(u uint64) string { return strconv.FormatUint(u, 10) }

// toldSeq returns the seq of tell's line "told: conversation C participant
// P seq S".
func toldSeq(t *testing.T, out string) string {
	t.Helper()
	_, seq, ok := strings.Cut(strings.TrimSpace(out), " seq ")
	if !ok || !strings.HasPrefix(out, "told: ") {
		t.Fatalf("tell printed %q, want told: ... seq S", out)
	}
	return seq
}

func readCredsT(t *testing.T, path string) client.Credential {
	t.Helper()
	c, err := readCreds(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestWriteCreds_Mode0600AtomicReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	c := client.Credential{Conversation: 1, Participant: 2, Generation: 3}
	c.Secret[0] = 9
	for g := uint64(3); g <= 4; g++ {
		c.Generation = g
		if err := writeCreds(path, c); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
		}
		if got := readCredsT(t, path); got != c {
			t.Errorf("readCreds = %v, want %v", got, c)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d files, want only the credential file (no temporary left)", len(entries))
	}
}

func TestRun_UnknownAndHelp(t *testing.T) {
	ctx := testCtx(t)
	if _, errs, code := ctl(ctx, "", "frobnicate"); code != 2 || !strings.Contains(errs, "tail") {
		t.Errorf("unknown subcommand = %d, %q", code, errs)
	}
	if _, errs, code := ctl(ctx, "", "tell", "-h"); code != 0 || !strings.Contains(errs, "tell first attaches") {
		t.Errorf("tell -h = %d, %q", code, errs)
	}
	if _, _, code := ctl(ctx, "", "ack", "--creds", "x"); code != 2 {
		t.Errorf("ack without --through = %d, want 2", code)
	}
}

// ctlResult is what a participantctl run printed, and its exit status.
type ctlResult struct {
	out, errs string
	code      int
}

// startTail runs participantctl tail --creds creds with args in the
// background and returns once the tail attached: its attach rewrites
// creds, enrolled at generation 1, with generation 2. The run's result
// comes on the channel.
func startTail(t *testing.T, ctx context.Context, creds string, args ...string) <-chan ctlResult {
	t.Helper()
	done := make(chan ctlResult, 1)
	go func() {
		out, errs, code := ctl(ctx, "", append([]string{"tail", "--creds", creds}, args...)...)
		done <- ctlResult{out, errs, code}
	}()
	for readCredsT(t, creds).Generation < 2 {
		select {
		case r := <-done:
			t.Fatalf("tail ended before attaching: %d, %q", r.code, r.errs)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return done
}

func TestTail_SupersededExitsWithStatus3(t *testing.T) {
	ctx := testCtx(t)
	addr, _ := startServer(t, t.TempDir())
	b := filepath.Join(t.TempDir(), "b.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "1", "--creds", b)
	done := startTail(t, ctx, b, "--addr", addr, "--check-interval", "10ms")
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", b, "x")
	r := <-done
	if r.code != exitSuperseded || !strings.Contains(r.errs, "binding superseded") {
		t.Errorf("superseded tail = exit %d, %q; want %d and a message", r.code, r.errs, exitSuperseded)
	}
}

func TestRun_UsageErrorsAreOneLineAndAPointerToHelp(t *testing.T) {
	ctx := testCtx(t)
	for _, args := range [][]string{
		{"tell", "--no-such-flag"},
		{"invite"},
	} {
		out, errs, code := ctl(ctx, "", args...)
		if code != 2 || out != "" {
			t.Errorf("participantctl %s = exit %d, stdout %q; want 2 and nothing", strings.Join(args, " "), code, out)
		}
		lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "participantctl "+args[0]+": ") ||
			lines[1] != "participantctl "+args[0]+" -h describes its arguments and flags." {
			t.Errorf("participantctl %s printed\n%s\nwant the error and one line pointing at -h", strings.Join(args, " "), errs)
		}
	}
	// -h prints the subcommand's whole usage and succeeds.
	if _, errs, code := ctl(ctx, "", "tell", "-h"); code != 0 || !strings.HasPrefix(errs, "usage: participantctl tell ") || !strings.Contains(errs, "-token") {
		t.Errorf("tell -h = exit %d, %q; want 0 and the usage with its flags", code, errs)
	}
	// No subcommand at all is a usage error that lists the subcommands.
	if _, errs, code := ctl(ctx, ""); code != 2 || !strings.Contains(errs, "subcommands:") {
		t.Errorf("participantctl alone = exit %d, %q; want 2 and the list of subcommands", code, errs)
	}
}

// A subcommand that became a command of its own answers with one line
// naming it, whatever its flags, and the usage error's status.
func TestRun_MovedSubcommandPointsAtItsCommand(t *testing.T) {
	ctx := testCtx(t)
	for _, args := range [][]string{{"bench"}, {"bench", "--embedded", "--clients", "4"}, {"bench", "-h"}} {
		out, errs, code := ctl(ctx, "", args...)
		if code != 2 || out != "" || errs != "participantctl: bench is now a command of its own: participantbench, with the same flags\n" {
			t.Errorf("participantctl %s = exit %d, stdout %q, stderr %q; want 2 and one line naming participantbench",
				strings.Join(args, " "), code, out, errs)
		}
	}
	if _, errs, _ := ctl(ctx, "", "help"); strings.Contains(errs, "bench") {
		t.Errorf("participantctl help lists bench:\n%s", errs)
	}
}

// A participant whose records the server released unacknowledged
// (--max-unacked-age) sees, when it tails again, a line saying which
// records are gone, then the records that follow.
func TestTail_SaysWhenRecordsWereReleased(t *testing.T) {
	ctx := testCtx(t)
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir(), CheckpointInterval: 10 * time.Millisecond,
		CheckpointRows: 1, Retain: time.Millisecond, MaxUnackedAge: 50 * time.Millisecond})
	addr := srv.Addr().String()
	a, b := filepath.Join(t.TempDir(), "a.json"), filepath.Join(t.TempDir(), "b.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "1", "--creds", a)
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "1", "--creds", b)
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "gone")
	// Nobody acknowledges anything: once the server retains no record,
	// it released them all, "gone" included.
	for srv.Service().Backlog().Records != 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the server never released the unacknowledged records")
		case <-time.After(5 * time.Millisecond):
		}
	}
	done := startTail(t, ctx, b, "--addr", addr, "--records-only", "--count", "1")
	mustCtl(t, ctx, "tell", "--addr", addr, "--creds", a, "after")
	r := <-done
	if r.code != 0 || !strings.Contains(r.errs, "are gone") || !strings.Contains(r.errs, "max-unacked-age") ||
		strings.Contains(r.out, "gone") || !strings.Contains(r.out, "after") {
		t.Errorf("tail after a release = exit %d, stdout %q, stderr %q; want the released line on stderr, then the record after", r.code, r.out, r.errs)
	}
}

// Flags come after the positional MESSAGE as readily as before it, and
// every one-shot command prints its result as one JSON object with --json.
func TestOnline_JSONResultsAndFlagsAfterArguments(t *testing.T) {
	ctx := testCtx(t)
	addr, _ := startServer(t, t.TempDir())
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")

	var r result
	decode := func(out string) result {
		t.Helper()
		var r result
		if err := json.Unmarshal([]byte(out), &r); err != nil || !strings.HasSuffix(out, "}\n") || strings.Count(out, "\n") != 1 {
			t.Fatalf("--json printed %q (%v), want one JSON object on one line", out, err)
		}
		return r
	}
	r = decode(mustCtl(t, ctx, "enroll", "--conversation", "7", "--json", "--addr", addr, "--creds", a))
	if r.Result != "enrolled" || r.Conversation != 7 || r.Participant != 0 || r.Generation != 1 {
		t.Errorf("enroll --json = %+v", r)
	}
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", b)
	r = decode(mustCtl(t, ctx, "tell", "hello", "--addr", addr, "--creds", a, "--json"))
	if r.Result != "told" || r.Conversation != 7 || r.Seq == nil || *r.Seq == 0 {
		t.Errorf("tell MESSAGE --json = %+v", r)
	}
	told := *r.Seq
	r = decode(mustCtl(t, ctx, "ack", "--addr", addr, "--creds", b, "--through", strconv.FormatUint(told, 10), "--json"))
	if r.Result != "acked" || r.Cursor == nil || *r.Cursor != told {
		t.Errorf("ack --json = %+v, want cursor %d", r, told)
	}
	r = decode(mustCtl(t, ctx, "attach", "--addr", addr, "--creds", b, "--json"))
	if r.Result != "attached" || r.Participant != 1 || r.Generation < 2 {
		t.Errorf("attach --json = %+v", r)
	}
	r = decode(mustCtl(t, ctx, "leave", "--json", "--addr", addr, "--creds", b))
	if r.Result != "left" || r.Seq == nil {
		t.Errorf("leave --json = %+v", r)
	}
	// Without --json the line is as before, whatever the flags' order.
	if out := mustCtl(t, ctx, "tell", "again", "--creds", a, "--addr", addr); !strings.HasPrefix(out, "told: conversation 7 participant 0 seq ") {
		t.Errorf("tell MESSAGE --flags = %q", out)
	}
}

// A dial error names where the address came from when --addr did not
// give it: PARTICIPANTCTL_ADDR, or the default.
func TestDial_ErrorNamesTheAddressSource(t *testing.T) {
	ctx := testCtx(t)
	creds := filepath.Join(t.TempDir(), "a.json")
	run1 := func(vars map[string]string, args ...string) string {
		var out, errb bytes.Buffer
		ee := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
		if code := run(ctx, ee, args); code == 0 {
			t.Fatalf("participantctl %v succeeded without a server", args)
		}
		return errb.String()
	}
	if got := run1(map[string]string{"PARTICIPANTCTL_ADDR": "bad"}, "enroll", "--conversation", "1", "--creds", creds); !strings.Contains(got, "from PARTICIPANTCTL_ADDR") {
		t.Errorf("dial error with PARTICIPANTCTL_ADDR=bad = %q, want it to name the variable", got)
	}
	if got := run1(nil, "enroll", "--conversation", "1", "--creds", creds, "--addr", "127.0.0.1:1"); strings.Contains(got, "PARTICIPANTCTL_ADDR") {
		t.Errorf("dial error with --addr = %q, want no mention of the variable", got)
	}
}

// Pointed at the health (HTTP) listener, which answers nothing to the
// protocol's hello, participantctl says what the address likely is
// instead of a bare "i/o timeout" (after the Cluster's attempt timeout).
func TestDial_HealthListenerNamed(t *testing.T) {
	ctx := testCtx(t)
	srv := servertest.Start(t, server.Config{DataDir: t.TempDir()})
	creds := filepath.Join(t.TempDir(), "a.json")
	health := srv.HealthAddr().String()
	_, errs, code := ctl(ctx, "", "enroll", "--addr", health, "--conversation", "1", "--creds", creds)
	if code == 0 {
		t.Fatalf("enroll through the health listener succeeded")
	}
	for _, want := range []string{"no welcome from " + health, "health listener", "--listen"} {
		if !strings.Contains(errs, want) {
			t.Errorf("enroll through the health listener: stderr %q, want it to say %q", errs, want)
		}
	}
}
