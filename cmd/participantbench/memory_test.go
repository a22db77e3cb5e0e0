package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/participantd/participantd/server"
)

// The --memory mode against a server of this process (--addr and
// --server-pid): the workloads run, every tell is answered told and every
// enroll past the cap refused, and the figures come from /proc and
// /metrics. The figures themselves are the benchmark's (BENCHMARKS.md),
// not asserted here.
func TestBench_Memory(t *testing.T) {
	ctx := context.Background()
	srv, stop, err := startEmbedded(ctx, server.Config{DataDir: t.TempDir(), MaxConversationsPerConn: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addr, health, pid := srv.Addr().String(), srv.HealthAddr().String(), strconv.Itoa(os.Getpid())

	rep := runBenchForTest(t, "--memory", memDeafReader, "--addr", addr, "--metrics-addr", health, "--server-pid", pid,
		"--volume", "256KiB", "--memory-payload", "4096", "--memory-settle", "0s")
	m := rep.Memory
	if m == nil || m.Told != 64 || m.VolumeBytes != 256<<10 || m.AnonPeakKiB < m.AnonBeforeKiB || m.AnonBeforeKiB == 0 {
		t.Fatalf("deaf-reader report = %+v, want 64 tells of 4 KiB and RSS figures", m)
	}
	if got := m.Metrics["participantd_backlog_total_bytes"]; got < 256<<10 {
		t.Errorf("deaf-reader report: backlog_total_bytes %v, want at least the 256 KiB told", got)
	}

	rep = runBenchForTest(t, "--memory", memRefusedEnrolls, "--addr", addr, "--server-pid", pid, "--count", "300", "--memory-settle", "0s")
	if m := rep.Memory; m == nil || m.Enrolled != 8 || m.Refused["capacity_exceeded"] != 300 {
		t.Fatalf("refused-enrolls report = %+v, want 8 enrolled, then 300 refused capacity_exceeded", m)
	}
}

func TestBench_MemoryRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--memory", "nap", "--server-bin", "/bin/true"},
		{"--memory", memDeafReader},
		{"--memory", memDeafReader, "--embedded"},
		{"--memory", memDeafReader, "--server-bin", "/bin/true", "--addr", "127.0.0.1:1"},
		{"--memory", memDeafReader, "--addr", "127.0.0.1:1"},
		{"--memory", memDeafReader, "--addr", "127.0.0.1:1", "--server-pid", "1", "--heap-profile", "x"},
		{"--memory", memDeafReader, "--server-bin", "/bin/true", "--volume", "0"},
		{"--memory", memDeafReader, "--server-bin", "/bin/true", "--volume", "2TB"},
		{"--memory", memDeafReader, "--server-bin", "/bin/true", "--memory-span", "-1"},
	} {
		if _, _, code := runForTest(args...); code != 2 {
			t.Errorf("%v = exit %d, want 2", args, code)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"200MiB": 200 << 20, "2GiB": 2 << 30, "4096": 4096, "1KiB": 1024, "7B": 7} {
		if got, err := parseSize(in); got != want || err != nil {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1MiB", "1.5GiB", "1TiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded, want an error", in)
		}
	}
}

// TestMemoryReport_AFailedScrapeIsSaid: a metrics read that fails is
// recorded and printed, and the deaf recipient's cut, which it would have
// shown, is printed unknown rather than false.
func TestMemoryReport_AFailedScrapeIsSaid(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	r := &memoryReport{Workload: memDeafReader}
	if _, ok := r.scrape(context.Background(), addr, memoryMetrics); ok {
		t.Fatal("a scrape of a closed port succeeded")
	}
	var b strings.Builder
	r.print(&b)
	out := b.String()
	if !strings.Contains(out, "metrics read failed: ") || !strings.Contains(out, "recipient cut by the server by the end: unknown") {
		t.Fatalf("report = %q, want the failed read and an unknown cut", out)
	}
}

// TestRSSSampler_DriftIsWhatStillGrowsAfterTheRamp checks the figures of
// the load: a server that ramps up in the first quarter and then holds
// steady, spikes aside, drifts by 0; one that keeps growing drifts by what
// it grew between the second quarter and the last.
func TestRSSSampler_DriftIsWhatStillGrowsAfterTheRamp(t *testing.T) {
	steady := make([]uint64, 0, 400)
	for i := range 400 {
		v := uint64(40 << 10)
		switch {
		case i < 100:
			v = uint64(i) * (40 << 10) / 100 // the ramp
		case i%37 == 0:
			v = 70 << 10 // a collector's peak
		}
		steady = append(steady, v)
	}
	growing := make([]uint64, 0, 400)
	for i := range 400 {
		growing = append(growing, uint64(10<<10+i*100))
	}
	for _, tc := range []struct {
		name          string
		anon          []uint64
		median, drift int64
	}{
		{"steady", steady, 40 << 10, 0},
		{"growing", growing, 10<<10 + 200*100, (350 - 150) * 100},
		{"too few samples", steady[:7], 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &rssSampler{pid: os.Getpid(), anon: tc.anon}
			var r memoryReport
			s.fill(&r)
			if int64(r.AnonMedianKiB) != tc.median || r.AnonDriftKiB != tc.drift {
				t.Errorf("median %d KiB, drift %d KiB; want %d, %d", r.AnonMedianKiB, r.AnonDriftKiB, tc.median, tc.drift)
			}
		})
	}
}

// TestRSSSampler_SpanPeaksCompareTheFirstAndLastSpansTold checks the
// peaks of the first and last spans of a deaf reader's volume: a server
// that holds a budget peaks alike in both, one that keeps what it was
// told peaks higher in the last; a volume under twice the span, or a load
// without progress, reports neither.
func TestRSSSampler_SpanPeaksCompareTheFirstAndLastSpansTold(t *testing.T) {
	const span, total = 200, 1000
	var told, budget, share []uint64
	for i := range 101 {
		d := uint64(i * total / 100)
		told = append(told, d)
		v := uint64(40)
		if i%10 == 5 {
			v = 60 // a collector's peak, in every stretch of the load
		}
		budget = append(budget, v)
		share = append(share, 10+d/10)
	}
	for _, tc := range []struct {
		name        string
		anon, told  []uint64
		span, total uint64
		first, last uint64
		nFirst      int
		nLast       int
	}{
		{"a budget", budget, told, span, total, 60, 60, 21, 21},
		{"a share of the volume", share, told, span, total, 30, 110, 21, 21},
		{"a volume under twice the span", budget, told, span, 2*span - 1, 0, 0, 0, 0},
		{"no progress", budget, nil, span, total, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &rssSampler{anon: tc.anon, told: tc.told}
			first, last, nFirst, nLast := s.spanPeaks(tc.span, tc.total)
			if first != tc.first || last != tc.last || nFirst != tc.nFirst || nLast != tc.nLast {
				t.Errorf("spanPeaks = %d, %d (%d and %d samples); want %d, %d (%d and %d)",
					first, last, nFirst, nLast, tc.first, tc.last, tc.nFirst, tc.nLast)
			}
		})
	}
}
