package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/participantd/participantd/internal/buildinfo"
	"github.com/participantd/participantd/internal/cli"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
)

// usage is printed by -h: the arguments, then what the command does.
const usage = `(--addr HOST:PORT [--metrics-addr HOST:PORT] | --embedded) [--ws] [flags]

Drives a server with pipelined requests from --clients clients (a
connection each, or --conns shared ones) and prints operations/s, latency
percentiles, and, from the server's /metrics, store commits per second
and operations per commit. Every counted answer is a success answer the
server gave after both barriers; after the run a sample of them (the
first and the latest) is re-sent with the same token and must replay. A
server with a token window may have forgotten the first ones by then:
their token_expired is reported as forgotten, not as a failure.

--op tell: --conversations conversations (default clients/2), the clients
spread over them; every tell is delivered to the other participants, which
ack cumulatively. --op enroll: every enroll creates a new conversation
(with --addr, start participantd with a --conversation-rate and
--conversation-burst above the load's, or its enrolls are refused).
--op mixed: half the clients tell, half enroll.

--conns K (tell shape) puts the --clients participants on K connections
instead of one each: every participant keeps its own window and its own
cumulative acks, the connection's reader hands each delivery to the
participant bound in its conversation, and what one read's answers make
the participants send leaves in one write. --clients 64 --window 1 --conns
2 is the nearest this protocol comes to etcd's strongest put configuration
below (64 putters, one put in flight each, over ONE connection): 64
participants, one tell in flight each, over TWO connections, because a
connection holds at most one binding per conversation and the tell shape's
conversations have two members; --conns 1 needs --conversations at least
--clients, a shape with one member per conversation whose tells are
delivered to no one (cheaper than the compared shape: no deliveries, no
acks). The report says how many connections carried the participants.

--ws drives the same load over WebSocket, one binary message a frame
(docs/PROTOCOL.md): --addr is then the server's --ws-listen address, and
an --embedded server listens for WebSocket too.

--etcd-compare then runs an embedded single-node etcd (fsync on) on the
same disk and measures its put rate with --clients putters putting
--payload bytes one at a time each over --etcd-conns shared client
connections (default 1, etcd's strongest configuration on this shape;
0 for one each), for the same --warmup and --duration, and reports
participantd's rate and p99 as ratios of etcd's.

--fsync-probe first measures the raw rate of write 200 B + fsync from one
goroutine in the data directory, so the report carries the physical
reference of the same run. --idle-connections N and --startup-records N
are separate modes (see their flags).

--disk-sample 30s --data-dir DIR (DIR the server's data directory, or
the embedded one) records the size of the data file and of the log every
30 s of the measured time with the operations counted by then, and reports
the bytes each operation added: with a server run with a short --retain,
whether its disk stays bounded under a steady load. --retain and
--token-window set the embedded server's (with --addr, give them to
participantd). Every token the bench sends is a UUIDv7 of the time it was
sent, so it runs against a server with a token window as without.
--rate N paces all clients together to N requests per second, so that
such a run's load does not follow how busy a shared machine is.`

// benchFlags are the bench's settings.
type benchFlags struct {
	addr, metricsAddr, dataDir string
	embedded                   bool
	ws                         bool
	load                       loadConfig
	duration, warmup           time.Duration
	probe                      bool
	probeDuration              time.Duration
	json                       bool
	cpuProfile, allocProfile   string
	idle                       int
	serverPID                  int
	startupRecords             int
	startupConversations       int
	startupCheckpoints         bool
	startupFixed               bool
	startupCrashSegments       int
	startupCrashWriter         string
	etcdCompare                bool
	etcdConns                  int
	diskSample                 time.Duration
	retain, tokenWindow        time.Duration // the embedded server's
	memory                     memoryConfig
}

func runBench(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e)
	var f benchFlags
	var version bool
	fs.BoolVar(&version, "version", false, "print the build and exit")
	fs.StringVar(&f.addr, "addr", "", "the server's wire address")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "the server's health listener, for /metrics (with --addr)")
	fs.BoolVar(&f.ws, "ws", false, "drive the load over WebSocket (one binary message a frame): --addr is then the server's --ws-listen address; with --embedded the server listens for WebSocket too")
	fs.BoolVar(&f.embedded, "embedded", false, "start an in-process server on --data-dir (default a temporary directory)")
	fs.StringVar(&f.dataDir, "data-dir", "", "the data directory: the embedded server's, and where --fsync-probe measures (default: a temporary directory with --embedded, else .)")
	fs.StringVar(&f.load.op, "op", opTell, "the operation: tell, enroll or mixed")
	fs.IntVar(&f.load.clients, "clients", 64, "clients: with --op tell participants, each with its own window (on --conns connections); with --op enroll connections")
	fs.IntVar(&f.load.conns, "conns", 0, "--op tell: connections the --clients participants share (0: one each); the two members of a conversation always sit on different connections (one binding per conversation per connection), so with two members each the least is 2")
	fs.IntVar(&f.load.conversations, "conversations", 0, "conversations of the tell shape (default clients/2: two participants each)")
	fs.IntVar(&f.load.payload, "payload", 200, "tell payload, bytes")
	fs.IntVar(&f.load.window, "window", 4, "tells (or enrolls) in flight per client; with --conns a participant's window is its own")
	fs.BoolVar(&f.load.ackWithTell, "ack-with-tell", false, "tell shape with --coalesce: a connection acks what was delivered only when it sends its next tell, in the same write (a client that piggybacks its acks), instead of as each delivery is read; a diagnostic of what the acks cost the server, not the benchmark's shape")
	fs.BoolVar(&f.load.coalesce, "coalesce", true, "tell shape without --rate: each connection's reader sends the next tell and the next ack from the callbacks of what it read, and writes what they sent together before it waits for the socket (false: a goroutine per connection sends the tells and another the acks, a write each, as before)")
	fs.Float64Var(&f.load.rate, "rate", 0, "requests per second of all clients together (0: as fast as the server answers); a steady load, for --disk-sample runs on a shared machine")
	fs.IntVar(&f.load.enrollPerConn, "enroll-per-conn", 512, "enroll shape: enrolls per connection before it says bye and reconnects")
	fs.IntVar(&f.load.verify, "verify", 1000, "counted answers to replay with their token after the run")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "measured time")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "load before measuring")
	fs.BoolVar(&f.probe, "fsync-probe", true, "measure the raw write+fsync rate of the data directory first")
	fs.DurationVar(&f.probeDuration, "probe-duration", 3*time.Second, "how long the fsync probe runs")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured window (with --embedded it covers the server)")
	fs.StringVar(&f.allocProfile, "allocprofile", "", "with --embedded: write the process's allocation profile (every allocation since the start, warmup included) after the measured window")
	fs.IntVar(&f.idle, "idle-connections", 0, "mode: open N connections, each bound in its own conversation, and report the server's RSS per connection")
	fs.IntVar(&f.serverPID, "server-pid", 0, "with --addr and --idle-connections: the server's pid, to read its RSS")
	fs.IntVar(&f.startupRecords, "startup-records", 0, "mode: build data directories of 1/10, 3/10 and all of N records over --startup-conversations, and time an embedded server to ready on each")
	fs.IntVar(&f.startupConversations, "startup-conversations", 10000, "conversations of --startup-records")
	fs.BoolVar(&f.startupFixed, "startup-fixed-conversations", false, "with --startup-records: every size has all --startup-conversations, only the records grow")
	fs.BoolVar(&f.startupCheckpoints, "startup-checkpoints", false, "with --startup-records: every record acknowledged, and each size also timed from a copy with checkpoints (participantctl compact)")
	fs.IntVar(&f.startupCrashSegments, "startup-crash-segments", 0, "with --startup-checkpoints: after the start from checkpoints, another process tells into new conversations with checkpoints held off until the log has N full segments and exits without closing (a crash), and the start that replays that log is timed too")
	fs.StringVar(&f.startupCrashWriter, "startup-crash-writer", "", "internal: the process of --startup-crash-segments, on this data directory")
	fs.DurationVar(&f.diskSample, "disk-sample", 0, "every this often during the measured time, record the size of --data-dir's data file and log and the operations counted so far, and report them as a table (0: off)")
	fs.BoolVar(&f.load.randomTokens, "random-tokens", false, "draw every token as the client library does (client.NewToken: a UUIDv7, the time then 74 random bits) instead of a UUIDv7 whose random part is a counter per client")
	fs.DurationVar(&f.retain, "retain", participant.DefaultRetain, "with --embedded: the server's --retain (settled history kept this long, then compacted)")
	fs.DurationVar(&f.tokenWindow, "token-window", 0, "with --embedded: the server's --token-window (0: off); every token the bench sends is a UUIDv7, so it runs against a window as it does without")
	fs.BoolVar(&f.etcdCompare, "etcd-compare", false, "after the load, measure an embedded etcd's put rate with the same clients, payload and durations on the same disk, and report the ratios")
	fs.IntVar(&f.etcdConns, "etcd-conns", 1, "with --etcd-compare: client connections the etcd putters share (1, the default, is etcd's strongest configuration here; 0 gives each putter its own, as etcd's benchmark put --conns does when set to --clients)")
	fs.StringVar(&f.memory.workload, "memory", "", "mode: measure the server's anonymous RSS under an abusive client, "+memDeafReader+" (a recipient that never reads, told --volume bytes) or "+memRefusedEnrolls+" (--count enrolls refused); against --server-bin, or --addr with --server-pid")
	f.memory.volume = 200 << 20
	f.memory.span = 200 << 20
	fs.Var(sizeFlag{&f.memory.volume}, "volume", "with --memory "+memDeafReader+": payload bytes told (B, KiB, MiB, GiB)")
	fs.Var(sizeFlag{&f.memory.span}, "memory-span", "with --memory "+memDeafReader+": also report RssAnon's peak while the first this many bytes were told and while the last were, when --volume is at least twice it")
	fs.IntVar(&f.memory.payload, "memory-payload", 64<<10, "with --memory "+memDeafReader+": bytes per tell")
	fs.IntVar(&f.memory.count, "count", 200000, "with --memory "+memRefusedEnrolls+": enrolls refused")
	fs.IntVar(&f.memory.window, "memory-window", 0, "with --memory: requests in flight (default 32 tells, 512 enrolls)")
	fs.StringVar(&f.memory.serverBin, "server-bin", "", "with --memory: start this participantd binary on a fresh temporary data directory, default settings, and measure it")
	fs.Var(listFlag{&f.memory.serverArgs}, "server-arg", "with --server-bin: one more argument for the server (repeat the flag)")
	fs.StringVar(&f.memory.heapProfile, "heap-profile", "", "with --memory and --server-bin: write the server's heap profile at the end of the load here (the server runs with --pprof)")
	fs.DurationVar(&f.memory.settle, "memory-settle", 2*time.Second, "with --memory: how long RSS is still sampled after the last answer")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if version {
		_, err := fmt.Fprint(e.stdout, buildinfo.Read().String("participantbench"))
		return err
	}
	if fs.NArg() > 0 {
		return &cli.ExitError{Code: cli.ExitUsage, Err: fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if f.memory.workload != "" {
		if f.memory.window == 0 {
			f.memory.window = 32
			if f.memory.workload == memRefusedEnrolls {
				f.memory.window = 512
			}
		}
		if err := f.memory.check(&f); err != nil {
			return &cli.ExitError{Code: cli.ExitUsage, Err: err}
		}
		rep := &benchReport{Machine: thisMachine()}
		if err := runMemory(ctx, &f, rep); err != nil {
			return err
		}
		return rep.print(e.stdout, f.json)
	}
	if f.startupCrashWriter != "" {
		return runCrashWriter(ctx, f.startupCrashWriter, f.startupCrashSegments)
	}
	if err := f.check(); err != nil {
		return &cli.ExitError{Code: cli.ExitUsage, Err: err}
	}
	if f.startupRecords > 0 {
		return runStartup(ctx, e, &f)
	}

	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	if f.embedded {
		raiseFileLimit(20000)
		if f.dataDir == "" {
			dir, err := os.MkdirTemp("", "participantd-bench-")
			if err != nil {
				return err
			}
			f.dataDir = dir
			cleanup = append(cleanup, func() { os.RemoveAll(dir) })
		}
	} else if f.dataDir == "" {
		f.dataDir = "."
	}

	rep := &benchReport{Machine: thisMachine(), DataDir: f.dataDir}
	if f.probe {
		rate, err := fsyncProbe(f.dataDir, f.probeDuration)
		if err != nil {
			return err
		}
		rep.FsyncPerSec = rate
	}
	if f.embedded {
		cfg := server.Config{DataDir: f.dataDir, Retain: f.retain, TokenWindow: f.tokenWindow}
		if f.ws {
			cfg.WSListen = "127.0.0.1:0"
		}
		srv, stop, err := startEmbedded(ctx, cfg)
		if err != nil {
			return err
		}
		cleanup = append(cleanup, stop)
		f.addr, f.metricsAddr = srv.Addr().String(), srv.HealthAddr().String()
		if f.ws {
			f.addr = srv.WSAddr().String()
		}
		f.serverPID = os.Getpid()
	}
	f.load.addr = f.addr
	if f.ws {
		f.load.addr = "ws://" + f.addr + "/"
	}
	if f.idle > 0 {
		if err := runIdle(ctx, &f, rep); err != nil {
			return err
		}
		return rep.print(e.stdout, f.json)
	}
	if err := runLoad(ctx, &f, rep, e.stderr); err != nil {
		return err
	}
	if f.probe {
		// The disk of a shared machine drifts: probe again after the load
		// and compare against the mean of both.
		rate, err := fsyncProbe(f.dataDir, f.probeDuration)
		if err != nil {
			return err
		}
		rep.FsyncAfterPerSec = rate
		rep.RatioToFsync = rep.OpsPerSec / ((rep.FsyncPerSec + rate) / 2)
	}
	if f.etcdCompare {
		fig, err := etcdPutBench(ctx, f.dataDir, f.load.clients, f.etcdConns, f.load.payload, f.warmup, f.duration)
		if err != nil {
			return err
		}
		fig.RatioOps = rep.OpsPerSec / fig.PutsPerS
		if fig.Latency.P99 > 0 {
			fig.RatioP99 = rep.Latency.P99 / fig.Latency.P99
		}
		rep.Etcd = fig
	}
	if err := rep.print(e.stdout, f.json); err != nil {
		return err
	}
	if rep.Errors > 0 || len(rep.VerifyFailures) > 0 {
		return &cli.ExitError{Code: 1, Err: fmt.Errorf("%d errors, %d replay failures", rep.Errors, len(rep.VerifyFailures))}
	}
	return nil
}

func (f *benchFlags) check() error {
	if f.startupRecords > 0 {
		if f.startupConversations <= 0 {
			return errors.New("--startup-conversations must be positive")
		}
		return nil
	}
	if f.embedded == (f.addr != "") {
		return errors.New("give exactly one of --addr and --embedded")
	}
	if f.retain <= 0 || f.tokenWindow < 0 {
		return errors.New("--retain must be positive, --token-window not negative")
	}
	if !f.embedded && (f.retain != participant.DefaultRetain || f.tokenWindow != 0) {
		return errors.New("--retain and --token-window configure the embedded server: give them to participantd with --addr")
	}
	switch f.load.op {
	case opTell, opEnroll, opMixed:
	default:
		return fmt.Errorf("--op %q: want tell, enroll or mixed", f.load.op)
	}
	if f.load.clients <= 0 || f.load.window <= 0 || f.load.payload < 0 || f.duration <= 0 || f.load.enrollPerConn <= 0 || f.load.rate < 0 {
		return errors.New("--clients, --window, --duration and --enroll-per-conn must be positive, --payload and --rate not negative")
	}
	if f.load.op == opMixed && f.load.clients < 2 {
		return errors.New("--op mixed needs at least 2 clients")
	}
	if f.load.conns < 0 || f.load.conns > f.load.clients {
		return fmt.Errorf("--conns %d: want 0 (one connection per client) up to --clients %d", f.load.conns, f.load.clients)
	}
	if f.load.shared() {
		if f.load.op != opTell {
			return fmt.Errorf("--conns shares connections between the tell shape's participants; --op %s opens a connection per client (an enroll client reconnects every --enroll-per-conn enrolls)", f.load.op)
		}
		convs := f.load.conversations
		if convs <= 0 {
			convs = max(1, f.load.clients/2)
		}
		if members := (f.load.clients + convs - 1) / convs; members > f.load.conns {
			return fmt.Errorf("--conns %d: the %d participants in %d conversations have up to %d members each, and a connection holds at most one binding per conversation: give --conns %d or more, or more --conversations", f.load.conns, f.load.clients, convs, members, members)
		}
	}
	return nil
}

// startEmbedded runs an in-process server of cfg, listening on loopback
// ports of its own, until stop is called, and waits until it is ready.
func startEmbedded(ctx context.Context, cfg server.Config) (*server.Server, func(), error) {
	cfg.Listen, cfg.HealthListen = "127.0.0.1:0", "127.0.0.1:0"
	// The enroll shape creates conversations as fast as the server takes
	// them: that is what it measures, not the per-client creation rate.
	cfg.ConversationRate, cfg.ConversationBurst = math.MaxInt32, math.MaxInt32
	srv, err := server.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		cancel()
		return nil, nil, fmt.Errorf("embedded server: %w", err)
	case <-ctx.Done():
		cancel()
		<-done
		return nil, nil, ctx.Err()
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	return srv, stop, nil
}

// runLoad runs the load of f and fills rep.
func runLoad(ctx context.Context, f *benchFlags, rep *benchReport, progress io.Writer) error {
	r, err := runLoadOf(ctx, f, rep, progress)
	if r != nil {
		r.close()
	}
	return err
}

// runLoadOf is runLoad but for closing the run's connections: once they
// are set up it returns the run, for the caller to look at and close.
func runLoadOf(ctx context.Context, f *benchFlags, rep *benchReport, progress io.Writer) (*loadRun, error) {
	r := &loadRun{cfg: f.load, nonce: newNonce()}
	if f.load.rate > 0 {
		// A burst of one request per client: the clients start together,
		// and then each waits its turn.
		r.limiter = rate.NewLimiter(rate.Limit(f.load.rate), f.load.clients)
	}
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	ackCtx, stopAcks := context.WithCancel(ctx)
	defer stopAcks()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var drivers, ackers sync.WaitGroup
	for _, w := range r.workers {
		drivers.Go(func() { w.drive(loadCtx) })
		if w.kind == opTell {
			ackers.Go(func() { w.acker(ackCtx) })
		}
	}

	sleep(ctx, f.warmup)
	var before, after serverCounters
	var scrapeErr error
	if f.metricsAddr != "" {
		before, scrapeErr = scrapeCounters(ctx, f.metricsAddr)
	}
	var stopProfile func()
	if f.cpuProfile != "" {
		var err error
		if stopProfile, err = startCPUProfile(f.cpuProfile); err != nil {
			return r, err
		}
	}
	var memBefore, memAfter runtime.MemStats
	var procBefore, procAfter procCounts
	if f.embedded {
		runtime.ReadMemStats(&memBefore)
		procBefore = readProcCounts()
	}
	t0 := time.Now()
	r.phase.Store(phaseMeasure)
	measure(ctx, f, r, t0, rep, progress)
	r.phase.Store(phaseDone)
	elapsed := time.Since(t0)
	if f.embedded {
		procAfter = readProcCounts()
		runtime.ReadMemStats(&memAfter)
		if f.allocProfile != "" {
			if err := writeAllocProfile(f.allocProfile); err != nil {
				return r, err
			}
		}
	}
	if stopProfile != nil {
		stopProfile()
	}
	if f.metricsAddr != "" && scrapeErr == nil {
		after, scrapeErr = scrapeCounters(ctx, f.metricsAddr)
	}
	stopLoad()
	drivers.Wait()
	stopAcks()
	ackers.Wait()

	rep.fill(f, r, elapsed)
	if f.embedded && rep.Ops > 0 {
		rep.Runtime = runtimeFigureOf(&memBefore, &memAfter, rep.Ops)
		rep.Syscalls = syscallFigureOf(procBefore, procAfter, rep.Ops)
	}
	if f.metricsAddr != "" {
		if scrapeErr != nil {
			rep.MetricsError = scrapeErr.Error()
		} else {
			secs := elapsed.Seconds()
			rep.CommitsPerSec = (after.Commits - before.Commits) / secs
			rep.FlushCallsPerSec = (after.Flushes - before.Flushes) / secs
			rep.ServerCommittedPerSec = (after.Committed - before.Committed) / secs
			if rep.Ops > 0 {
				rep.CPUSecondsPer1000 = (after.CPUSeconds - before.CPUSeconds) / float64(rep.Ops) * 1000
				rep.CPUIncludesClient = f.embedded
			}
			if c := after.Commits - before.Commits; c > 0 {
				rep.OpsPerCommit = float64(rep.Ops) / c
				rep.ServerOpsPerCommit = (after.Committed - before.Committed) / c
			}
			staged := f.load.op
			if staged != opEnroll {
				staged = opTell // mixed: its tells
			}
			rep.Stages = stageFigures(staged, before, after)
		}
	}
	verifyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rep.Verified, rep.Forgotten, rep.VerifyFailures = r.verify(verifyCtx)
	if len(rep.VerifyFailures) > 5 {
		rep.VerifyFailures = rep.VerifyFailures[:5]
	}
	return r, nil
}

func writeAllocProfile(path string) error {
	pf, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(pf, 0); err != nil {
		pf.Close()
		return err
	}
	return pf.Close()
}

func startCPUProfile(path string) (func(), error) {
	pf, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		pf.Close()
	}, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// raiseFileLimit raises the soft open-file limit towards n (never above the
// hard limit): an embedded run holds both ends of every connection.
func raiseFileLimit(n uint64) {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil || lim.Cur >= n {
		return
	}
	lim.Cur = min(n, lim.Max)
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// machine describes where the figures were measured.
type machine struct {
	CPUs    int    `json:"cpus"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	Go      string `json:"go"`
	Model   string `json:"cpu_model,omitempty"`
	Kernel  string `json:"kernel,omitempty"`
	Storage string `json:"storage,omitempty"`
}

func thisMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version()}
	m.Model = cpuModel()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = string(trimNL(b))
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range splitLines(b) {
		if k, v, ok := cutColon(line); ok && k == "model name" {
			return v
		}
	}
	return ""
}

// writeJSON writes v indented.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
