package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// runBenchForTest runs `participantbench args...` in process and decodes
// its --json report.
func runBenchForTest(t *testing.T, args ...string) benchReport {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb}
	if code := run(context.Background(), e, append([]string{"--json"}, args...)); code != 0 {
		t.Fatalf("bench %v = exit %d, stderr:\n%s\nstdout:\n%s", args, code, errb.String(), out.String())
	}
	var rep benchReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("bench %v printed no JSON report: %v\n%s", args, err, out.String())
	}
	return rep
}

func TestBench_Embedded_CountsOnlyVerifiedDurableAnswers(t *testing.T) {
	for _, op := range []string{opTell, opEnroll, opMixed} {
		t.Run(op, func(t *testing.T) {
			rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--op", op, "--clients", "4",
				"--duration", "1s", "--warmup", "100ms", "--probe-duration", "50ms", "--enroll-per-conn", "8", "--verify", "20")
			if rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 {
				t.Fatalf("report = ops %d, errors %d (%s), verified %d, failures %v; want ops > 0, no errors, replays verified",
					rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures)
			}
			if rep.FsyncPerSec <= 0 || rep.CommitsPerSec <= 0 || rep.OpsPerCommit <= 0 {
				t.Fatalf("report = fsync %.0f/s, commits %.0f/s, ops/commit %.2f; want all positive", rep.FsyncPerSec, rep.CommitsPerSec, rep.OpsPerCommit)
			}
			// The server's stages of the measured operation, read off
			// its /metrics, end with the whole request.
			if n := len(rep.Stages); n < 2 || rep.Stages[0].Stage != "worker" || rep.Stages[n-1].Stage != "total" || rep.Stages[n-1].Count <= 0 {
				t.Fatalf("report's server stages = %+v; want worker first and a counted total last", rep.Stages)
			}
		})
	}
}

func TestBench_IdleConnections(t *testing.T) {
	rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--idle-connections", "20", "--fsync-probe=false")
	if rep.Idle == nil || rep.Idle.Connections != 20 {
		t.Fatalf("idle report = %+v, want 20 connections", rep.Idle)
	}
}

func TestBench_Startup(t *testing.T) {
	rep := runBenchForTest(t, "--startup-records", "200", "--startup-conversations", "20", "--data-dir", t.TempDir(), "--fsync-probe=false")
	if len(rep.Startup) != 3 || rep.Startup[2].Records != 200 || rep.Startup[2].ReadySeconds <= 0 {
		t.Fatalf("startup = %+v, want 3 sizes up to 200 records", rep.Startup)
	}
}

func TestBench_RefusesBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb}
	for _, args := range [][]string{
		{},
		{"--embedded", "--addr", "127.0.0.1:1"},
		{"--embedded", "--op", "dance"},
		{"--embedded", "--token-window", "-1s"},
		{"--embedded", "--retain", "0s"},
		{"--addr", "127.0.0.1:1", "--token-window", "1m"},
	} {
		if code := run(context.Background(), e, args); code != 2 {
			t.Errorf("%v = exit %d, want 2", args, code)
		}
	}
}

// TestBench_DiskSampleAndRandomTokens: --disk-sample reports the data
// file's size at both ends of the measured time and between, with the
// counted operations growing; --random-tokens' answers replay as the
// counter's do.
func TestBench_DiskSampleAndRandomTokens(t *testing.T) {
	rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--clients", "4", "--random-tokens",
		"--duration", "600ms", "--warmup", "0s", "--fsync-probe=false", "--disk-sample", "200ms", "--verify", "20")
	if rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 {
		t.Fatalf("report = ops %d, errors %d (%s), verified %d, failures %v; want ops > 0, no errors, replays verified",
			rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures)
	}
	if rep.DiskError != "" || len(rep.Disk) < 3 {
		t.Fatalf("disk samples = %+v, error %q; want at least 3", rep.Disk, rep.DiskError)
	}
	first, last := rep.Disk[0], rep.Disk[len(rep.Disk)-1]
	if first.DataFile <= 0 || last.Ops <= first.Ops || last.Ops > rep.Ops || last.Seconds < first.Seconds {
		t.Fatalf("disk samples = %+v with %d ops counted; want a data file, and ops growing up to the count", rep.Disk, rep.Ops)
	}
}

// TestBench_RandomTokensAreNotACounter: two tokens of one client differ
// beyond the counter's bits.
func TestBench_RandomTokensAreNotACounter(t *testing.T) {
	w := &worker{run: &loadRun{cfg: loadConfig{randomTokens: true}}}
	a, b := w.token(), w.token()
	if a == b || bytes.Equal(a[8:12], b[8:12]) {
		t.Fatalf("tokens %x and %x: want independent random tokens", a, b)
	}
}

// Every token the bench sends, counter or random, is a UUIDv7 of the time
// it was minted, so that a server running a token window accepts it; the
// counter's are distinct across workers and runs.
func TestBench_TokensAreUUIDv7OfNow(t *testing.T) {
	seen := make(map[wire.Token]bool)
	for _, random := range []bool{false, true} {
		for run := range 2 {
			r := &loadRun{cfg: loadConfig{randomTokens: random}, nonce: newNonce()}
			for i := range 3 {
				w := &worker{run: r, index: i}
				for range 100 {
					before := time.Now().UnixMilli()
					tok := w.token()
					after := time.Now().UnixMilli()
					ms, ok := tok.UnixMilli()
					// client.NewToken's sub-millisecond counter may carry a
					// token a little past the clock (see its test).
					if !ok || ms < before || ms > after+1000 {
						t.Fatalf("random %v, run %d, worker %d: token %s UnixMilli = %d, %v; want a v7 in [%d, %d]",
							random, run, i, tok, ms, ok, before, after+1000)
					}
					if seen[tok] {
						t.Fatalf("random %v, run %d, worker %d: token %s minted twice", random, run, i, tok)
					}
					seen[tok] = true
				}
			}
		}
	}
}

// --retain and --token-window reach the embedded server: a run with a
// window counts and replays as one without (its tokens are all UUIDv7).
func TestBench_EmbeddedTokenWindow(t *testing.T) {
	rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--op", opMixed, "--clients", "4",
		"--retain", "1s", "--token-window", "1m", "--duration", "500ms", "--warmup", "0s", "--fsync-probe=false",
		"--enroll-per-conn", "8", "--verify", "20")
	if rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 {
		t.Fatalf("report = ops %d, errors %d (%s), verified %d, failures %v; want ops > 0, no errors, replays verified",
			rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures)
	}
}

// The start-up bench times the restart of a server that has run on the
// log-first store, whose bbolt file has a persisted freelist (so that a
// start does not walk the file): the directories it builds, plain and
// checkpointed, have one.
func TestBench_StartupDataDirsHaveAPersistedFreelist(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "built")
	if err := buildDataDir(ctx, dir, 4, 40, 16, true); err != nil {
		t.Fatal(err)
	}
	ck := dir + "-checkpointed"
	if err := checkpointedCopy(ctx, dir, ck); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, ck} {
		raw, err := os.ReadFile(filepath.Join(d, server.StoreFile))
		if err != nil {
			t.Fatal(err)
		}
		// bbolt v1.5's meta pages: page size at 24, freelist page at 48
		// (2^64-1: none), txid at 64; the higher valid txid is in use.
		le := binary.LittleEndian
		ps := int(le.Uint32(raw[24:]))
		meta := raw[:ps]
		if m := raw[ps : 2*ps]; le.Uint32(m[16:]) == 0xED0CDAED && le.Uint64(m[64:]) > le.Uint64(meta[64:]) {
			meta = m
		}
		if le.Uint64(meta[48:]) == ^uint64(0) {
			t.Errorf("%s: the bbolt file has no persisted freelist", d)
		}
	}
}

// TestFsyncProbe_CreatesItsDirectory: `participantbench --embedded --data-dir NEW`
// probes before the server creates NEW, so the probe creates it.
func TestFsyncProbe_CreatesItsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "data")
	rate, err := fsyncProbe(dir, 20*time.Millisecond)
	if err != nil || rate <= 0 {
		t.Fatalf("fsyncProbe(%s) = %v, %v; want a rate", dir, rate, err)
	}
}

// Against a server whose token window forgets the first samples' tokens
// before the run ends, those replays are counted as forgotten, not as
// failures, and the latest samples, still inside the window, verify.
func TestBench_VerifyUnderATokenWindowThatForgets(t *testing.T) {
	ctx := context.Background()
	srv, stop, err := startEmbedded(ctx, server.Config{DataDir: t.TempDir(), TokenWindow: 300 * time.Millisecond, TokenSkew: 10 * time.Millisecond,
		Retain: time.Millisecond, CheckpointInterval: 10 * time.Millisecond, CheckpointRows: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	f := &benchFlags{duration: 1500 * time.Millisecond, load: loadConfig{addr: srv.Addr().String(), op: opTell,
		clients: 2, payload: 10, window: 2, enrollPerConn: 8, verify: 8}}
	rep := &benchReport{}
	if err := runLoad(ctx, f, rep, io.Discard); err != nil {
		t.Fatal(err)
	}
	if rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 || rep.Forgotten == 0 {
		t.Fatalf("report = ops %d, errors %d (%s), verified %d, forgotten %d, failures %v; want the first samples forgotten, the latest verified, nothing failed",
			rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.Forgotten, rep.VerifyFailures)
	}
}

// TestBench_RateCapsTheLoad: --rate paces all clients together, so the
// measured operations stay within the rate times the measured time, plus
// one request per client of burst, plus the requests in flight when the
// measurement began (sent during the warm-up, answered after: on a busy
// machine the whole window of every client). An upper bound only: a busy
// machine may fall short of the rate, never above it; unpaced, the same
// run counts thousands.
func TestBench_RateCapsTheLoad(t *testing.T) {
	const rate, clients, window = 100, 4, 4
	rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--clients", "4", "--window", "4", "--rate", "100",
		"--duration", "1s", "--warmup", "200ms", "--fsync-probe=false", "--verify", "5")
	if rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 {
		t.Fatalf("report = ops %d, errors %d (%s), failures %v; want ops, no errors", rep.Ops, rep.Errors, rep.FirstError, rep.VerifyFailures)
	}
	if limit := uint64(rate*rep.Seconds) + clients*window + clients + 1; rep.Ops > limit {
		t.Fatalf("--rate %d for %.2f s counted %d operations, want at most %d", rate, rep.Seconds, rep.Ops, limit)
	}
}

// TestBench_OverWebSocket: --ws drives the load through the server's
// WebSocket listener; every counted answer verifies by replay as over TCP.
func TestBench_OverWebSocket(t *testing.T) {
	rep := runBenchForTest(t, "--embedded", "--ws", "--data-dir", t.TempDir(), "--clients", "2", "--window", "4",
		"--duration", "300ms", "--warmup", "100ms", "--fsync-probe=false", "--verify", "5")
	if rep.Transport != "websocket" || rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 {
		t.Fatalf("report = %s, ops %d, errors %d (%s), verified %d, failures %v; want ops over WebSocket, all verified",
			rep.Transport, rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures)
	}
}

// TestBench_TellShapeAcksEveryDeliveredTell: the tell shape, driven from
// each connection's reader with the next tell and ack written together
// (--coalesce, the default), with the acks held for the next tell
// (--ack-with-tell), and by goroutines a write each, counts verified
// answers and acknowledges the deliveries, at one request in flight and
// at four.
func TestBench_TellShapeAcksEveryDeliveredTell(t *testing.T) {
	for _, mode := range []string{"--coalesce=true", "--ack-with-tell", "--coalesce=false"} {
		for _, window := range []string{"1", "4"} {
			t.Run(mode[2:]+"/window="+window, func(t *testing.T) {
				rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--op", opTell, "--clients", "4",
					"--window", window, mode, "--duration", "500ms", "--warmup", "100ms",
					"--fsync-probe=false", "--verify", "20")
				if rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 || rep.Acks == 0 {
					t.Fatalf("report = ops %d, errors %d (%s), verified %d, failures %v, acks %d; want ops > 0, no errors, replays verified, acks",
						rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures, rep.Acks)
				}
			})
		}
	}
}
