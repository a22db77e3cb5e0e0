package main

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"
)

// benchReport is what one bench run prints.
type benchReport struct {
	Machine     machine `json:"machine"`
	DataDir     string  `json:"data_dir"`
	FsyncPerSec float64 `json:"fsync_probe_per_s,omitempty"`
	// FsyncAfterPerSec is the probe again after the load; the ratio is
	// against the mean of both.
	FsyncAfterPerSec float64 `json:"fsync_probe_after_per_s,omitempty"`

	Op        string `json:"op,omitempty"`
	Transport string `json:"transport,omitempty"` // "tcp" or "websocket"
	Clients   int    `json:"clients,omitempty"`
	// Conns is how many connections carried the clients.
	Conns         int     `json:"connections,omitempty"`
	Conversations int     `json:"conversations,omitempty"`
	Payload       int     `json:"payload_bytes,omitempty"`
	Window        int     `json:"window,omitempty"`
	Seconds       float64 `json:"seconds,omitempty"`

	Ops       uint64              `json:"ops"`
	OpsPerSec float64             `json:"ops_per_s"`
	Latency   summary             `json:"latency"`
	ByOp      map[string]opFigure `json:"by_op,omitempty"`
	Acks      uint64              `json:"acks,omitempty"`

	CommitsPerSec         float64 `json:"store_commits_per_s,omitempty"`
	FlushCallsPerSec      float64 `json:"store_flush_calls_per_s,omitempty"`
	OpsPerCommit          float64 `json:"ops_per_commit,omitempty"`
	ServerCommittedPerSec float64 `json:"server_committed_ops_per_s,omitempty"`
	ServerOpsPerCommit    float64 `json:"server_committed_ops_per_commit,omitempty"`
	MetricsError          string  `json:"metrics_error,omitempty"`
	// Stages is where the server says the measured operation's time went,
	// stage by stage, from its /metrics over the measured window (the
	// bench client's own time is not in it).
	Stages       []stageFigure `json:"server_stages,omitempty"`
	RatioToFsync float64       `json:"ratio_to_fsync,omitempty"`
	// CPUSecondsPer1000 is the server process's CPU time per 1,000 counted
	// operations; with --embedded the process is also the bench client.
	CPUSecondsPer1000 float64 `json:"cpu_seconds_per_1000_ops,omitempty"`
	CPUIncludesClient bool    `json:"cpu_includes_client,omitempty"`
	// Runtime is the Go runtime's allocation and collection per 1,000
	// counted operations over the measured window, with --embedded
	// (server and bench client in one process).
	Runtime *runtimeFigure `json:"go_runtime,omitempty"`
	// Syscalls is the process's system calls and context switches per
	// counted operation over the measured window, with --embedded.
	Syscalls *syscallFigure `json:"syscalls,omitempty"`

	Errors     uint64 `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	Verified   int    `json:"verified_replays"`
	// Forgotten counts samples whose replay a server running a token
	// window refused token_expired: older than its window, so forgotten
	// by design (not a failure, not verified either).
	Forgotten      int      `json:"forgotten_replays,omitempty"`
	VerifyFailures []string `json:"verify_failures,omitempty"`

	Disk      []diskSample `json:"disk,omitempty"`
	DiskError string       `json:"disk_error,omitempty"`

	Etcd    *etcdFigure     `json:"etcd_put,omitempty"`
	Idle    *idleReport     `json:"idle,omitempty"`
	Memory  *memoryReport   `json:"memory,omitempty"`
	Startup []startupFigure `json:"startup,omitempty"`
}

// opFigure is the share of one operation kind in a mixed run.
type opFigure struct {
	Clients   int     `json:"clients"`
	Ops       uint64  `json:"ops"`
	OpsPerSec float64 `json:"ops_per_s"`
	Latency   summary `json:"latency"`
}

func (rep *benchReport) fill(f *benchFlags, r *loadRun, elapsed time.Duration) {
	rep.Op, rep.Clients, rep.Payload, rep.Window = f.load.op, f.load.clients, f.load.payload, f.load.window
	rep.Transport = "tcp"
	if f.ws {
		rep.Transport = "websocket"
	}
	rep.Seconds = elapsed.Seconds()
	rep.Conns = len(r.conns)
	if r.conns == nil {
		rep.Conns = len(r.workers)
	}
	convs := map[uint64]bool{}
	var all latencies
	by := map[string]*opFigure{}
	byLat := map[string]latencies{}
	for _, w := range r.workers {
		n := w.count.Load()
		rep.Ops += n
		rep.Errors += w.errCount.Load()
		if p := w.firstErr.Load(); p != nil && rep.FirstError == "" {
			rep.FirstError = *p
		}
		rep.Acks += w.acks.Load()
		all = append(all, w.lat...)
		fig := by[w.kind]
		if fig == nil {
			fig = &opFigure{}
			by[w.kind] = fig
		}
		fig.Clients++
		fig.Ops += n
		byLat[w.kind] = append(byLat[w.kind], w.lat...)
		if w.kind == opTell {
			convs[w.conv] = true
		}
	}
	rep.Conversations = len(convs)
	rep.OpsPerSec = float64(rep.Ops) / rep.Seconds
	rep.Latency = all.summary()
	if rep.FsyncPerSec > 0 {
		rep.RatioToFsync = rep.OpsPerSec / rep.FsyncPerSec
	}
	if len(by) > 1 {
		rep.ByOp = map[string]opFigure{}
		for k, fig := range by {
			fig.OpsPerSec = float64(fig.Ops) / rep.Seconds
			fig.Latency = byLat[k].summary()
			rep.ByOp[k] = *fig
		}
	}
}

func (rep *benchReport) print(w io.Writer, asJSON bool) error {
	if asJSON {
		return writeJSON(w, rep)
	}
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "machine: %d CPUs (%s), %s/%s, kernel %s, %s\n", m.CPUs, m.Model, m.OS, m.Arch, m.Kernel, m.Go)
	if rep.DataDir != "" {
		fmt.Fprintf(&b, "data dir: %s\n", rep.DataDir)
	}
	if rep.FsyncPerSec > 0 {
		fmt.Fprintf(&b, "fsync probe: %.0f write(200 B)+fsync/s from 1 goroutine (%.3f ms each)", rep.FsyncPerSec, 1000/rep.FsyncPerSec)
		if rep.FsyncAfterPerSec > 0 {
			fmt.Fprintf(&b, "; after the load %.0f/s; ratio below against the mean %.0f/s", rep.FsyncAfterPerSec, (rep.FsyncPerSec+rep.FsyncAfterPerSec)/2)
		}
		b.WriteString("\n")
	}
	if rep.Idle != nil {
		rep.Idle.print(&b)
	}
	if rep.Memory != nil {
		rep.Memory.print(&b)
	}
	for _, s := range rep.Startup {
		fmt.Fprintf(&b, "startup: %d conversations, %d records (%.1f MiB file): ready in %.2f s (built in %.1f s)",
			s.Conversations, s.Records, float64(s.FileBytes)/(1<<20), s.ReadySeconds, s.BuildSeconds)
		fmt.Fprintf(&b, ", peak heap %.1f MiB", float64(s.ReadyPeakHeap)/(1<<20))
		if s.CheckpointReadySeconds > 0 {
			fmt.Fprintf(&b, "; from checkpoints in %.2f s (%.2f CPU-s), peak heap %.1f MiB", s.CheckpointReadySeconds, s.CheckpointCPUSeconds, float64(s.CheckpointPeakHeap)/(1<<20))
		}
		if s.RestartReadySeconds > 0 {
			fmt.Fprintf(&b, "; restarted in %.2f s, peak heap %.1f MiB", s.RestartReadySeconds, float64(s.RestartPeakHeap)/(1<<20))
		}
		if c := s.CrashLog; c != nil {
			fmt.Fprintf(&b, "; then with a crash's log of %d segments, %d records, %.1f MiB: ready in %.2f s, peak heap %.1f MiB (%.1f MiB allocated)",
				c.Segments, c.Records, float64(c.Bytes)/(1<<20), c.ReadySeconds, float64(c.PeakHeap)/(1<<20), float64(c.Allocated)/(1<<20))
		}
		b.WriteString("\n")
	}
	if rep.Op != "" {
		fmt.Fprintf(&b, "load: --op %s over %s, %d clients over %d connections, %d tell conversations, payload %d B, window %d per client, %.1f s measured\n",
			rep.Op, rep.Transport, rep.Clients, rep.Conns, rep.Conversations, rep.Payload, rep.Window, rep.Seconds)
		fmt.Fprintf(&b, "  %s: %.0f ops/s (%d durable answers); latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
			rep.Op, rep.OpsPerSec, rep.Ops, rep.Latency.P50, rep.Latency.P90, rep.Latency.P99, rep.Latency.Max)
		for k, fig := range rep.ByOp {
			fmt.Fprintf(&b, "    %s (%d clients): %.0f ops/s; p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
				k, fig.Clients, fig.OpsPerSec, fig.Latency.P50, fig.Latency.P99, fig.Latency.Max)
		}
		if rep.Acks > 0 {
			fmt.Fprintf(&b, "  acks (cumulative, not counted): %d\n", rep.Acks)
		}
		if rep.MetricsError != "" {
			fmt.Fprintf(&b, "  server metrics: %s\n", rep.MetricsError)
		} else if rep.CommitsPerSec > 0 {
			fmt.Fprintf(&b, "  server: %.0f store commits (flushes)/s, %.2f counted ops per commit; %.0f committed ops/s of every kind, %.2f per commit; %.0f Flush calls/s\n",
				rep.CommitsPerSec, rep.OpsPerCommit, rep.ServerCommittedPerSec, rep.ServerOpsPerCommit, rep.FlushCallsPerSec)
		}
		if len(rep.Stages) > 0 {
			fmt.Fprintf(&b, "  server stages of %s (from its /metrics over the measured window; ms; the means up to the total's add up to it; etcd_txn, in cluster mode, is per etcd commit transaction):\n", rep.Op)
			for _, st := range rep.Stages {
				fmt.Fprintf(&b, "    %-12s mean %7.2f  p50 %7.2f  p90 %7.2f  p99 %7.2f  (%.0f)\n", st.Stage, st.Mean, st.P50, st.P90, st.P99, st.Count)
			}
		}
		if rep.CPUSecondsPer1000 > 0 {
			who := "server only"
			if rep.CPUIncludesClient {
				who = "server and bench client: one process with --embedded"
			}
			fmt.Fprintf(&b, "  cpu: %.3f CPU-seconds per 1,000 counted ops (%s)\n", rep.CPUSecondsPer1000, who)
		}
		if g := rep.Runtime; g != nil {
			fmt.Fprintf(&b, "  go runtime: per 1,000 counted ops %.0f allocations, %.0f KiB allocated, %.2f collections (%.1f MB goal at the end; server and bench client)\n",
				g.AllocsPer1000, g.KiBPer1000, g.GCsPer1000, g.HeapGoalMB)
		}
		if g := rep.Syscalls; g != nil {
			fmt.Fprintf(&b, "  syscalls: per counted op %.2f reads, %.2f writes; %.2f voluntary and %.2f involuntary thread switches (server and bench client)\n",
				g.ReadsPerOp, g.WritesPerOp, g.VoluntaryPerOp, g.InvoluntPerOp)
		}
		if rep.RatioToFsync > 0 {
			fmt.Fprintf(&b, "  ratio: %.2f x the fsync probe rate\n", rep.RatioToFsync)
		}
		if f := rep.Etcd; f != nil {
			fmt.Fprintf(&b, "  etcd put (embedded, same disk, fsync %v): %d clients over %d connections, %d B: %.0f puts/s; p50 %.2f ms, p99 %.2f ms; %d errors\n",
				f.EtcdFsync, f.Clients, f.Conns, f.Payload, f.PutsPerS, f.Latency.P50, f.Latency.P99, f.Errors)
			fmt.Fprintf(&b, "  vs etcd: %.2f x its put rate, p99 %.2f x its p99\n", f.RatioOps, f.RatioP99)
		}
		printDisk(&b, rep.Disk)
		if rep.DiskError != "" {
			fmt.Fprintf(&b, "  disk sampling stopped: %s\n", rep.DiskError)
		}
		fmt.Fprintf(&b, "  errors: %d", rep.Errors)
		if rep.FirstError != "" {
			fmt.Fprintf(&b, " (first: %s)", rep.FirstError)
		}
		fmt.Fprintf(&b, "\n  verified: %d counted answers replayed with their token, %d failures\n", rep.Verified, len(rep.VerifyFailures))
		if rep.Forgotten > 0 {
			fmt.Fprintf(&b, "  forgotten: %d more were refused token_expired, older than the server's token window\n", rep.Forgotten)
		}
		for _, f := range rep.VerifyFailures {
			fmt.Fprintf(&b, "    %s\n", f)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func trimNL(b []byte) []byte { return bytes.TrimRight(b, "\n") }

func splitLines(b []byte) []string { return strings.Split(string(b), "\n") }

func cutColon(line string) (k, v string, ok bool) {
	k, v, ok = strings.Cut(line, ":")
	return strings.TrimSpace(k), strings.TrimSpace(v), ok
}

// runtimeFigure is the Go runtime's work per 1,000 counted operations:
// on a shared machine, where the rate moves with the neighbours' load,
// these move only with the code.
type runtimeFigure struct {
	AllocsPer1000 float64 `json:"allocs_per_1000_ops"`
	KiBPer1000    float64 `json:"kib_allocated_per_1000_ops"`
	GCsPer1000    float64 `json:"gcs_per_1000_ops"`
	HeapGoalMB    float64 `json:"heap_goal_mb"`
}

func runtimeFigureOf(before, after *runtime.MemStats, ops uint64) *runtimeFigure {
	k := 1000 / float64(ops)
	return &runtimeFigure{
		AllocsPer1000: float64(after.Mallocs-before.Mallocs) * k,
		KiBPer1000:    float64(after.TotalAlloc-before.TotalAlloc) / 1024 * k,
		GCsPer1000:    float64(after.NumGC-before.NumGC) * k,
		HeapGoalMB:    float64(after.NextGC) / 1e6,
	}
}
