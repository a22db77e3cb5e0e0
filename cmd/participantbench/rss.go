package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// rssSampler reads a process's RssAnon and VmRSS every 10 ms and keeps
// their peaks, and the RssAnon samples taken until loadEnded.
type rssSampler struct {
	pid                  int
	anonBefore, rssBefor uint64
	anonPeak, rssPeak    atomic.Uint64
	quit, done           chan struct{}
	// anon are the RssAnon samples taken under the load, in order, until
	// loadEnded sets ended, and done, when progress is set, what the load
	// had done at each (bytes told). Written by the sampling goroutine,
	// read once it is done.
	anon, told []uint64
	ended      atomic.Bool
	// progress, when set, reads how far the load is (bytes told).
	progress func() uint64
}

// startRSSSampler starts sampling process pid; progress, if not nil,
// reads how far the load is at each sample (spanPeaks).
func startRSSSampler(pid int, progress func() uint64) (*rssSampler, error) {
	st, err := procStatus(pid)
	if err != nil {
		return nil, err
	}
	s := &rssSampler{pid: pid, anonBefore: st["RssAnon"], rssBefor: st["VmRSS"], quit: make(chan struct{}), done: make(chan struct{}), progress: progress}
	s.anonPeak.Store(s.anonBefore)
	s.rssPeak.Store(s.rssBefor)
	go s.run()
	return s, nil
}

func (s *rssSampler) run() {
	defer close(s.done)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-s.quit:
			return
		}
		s.sample()
	}
}

func (s *rssSampler) sample() {
	st, err := procStatus(s.pid)
	if err != nil {
		return
	}
	if v := st["RssAnon"]; v > s.anonPeak.Load() {
		s.anonPeak.Store(v)
	}
	if !s.ended.Load() {
		s.anon = append(s.anon, st["RssAnon"])
		if s.progress != nil {
			s.told = append(s.told, s.progress())
		}
	}
	if v := st["VmRSS"]; v > s.rssPeak.Load() {
		s.rssPeak.Store(v)
	}
}

// loadEnded marks the end of the load: the samples after it (a settle)
// count for the peak, not for the figures of the load (fill).
func (s *rssSampler) loadEnded() { s.ended.Store(true) }

// stop ends the sampling after one last sample.
func (s *rssSampler) stop() {
	close(s.quit)
	<-s.done
	s.sample()
}

func (s *rssSampler) fill(r *memoryReport) {
	r.AnonBeforeKiB, r.RSSBeforeKiB = s.anonBefore, s.rssBefor
	r.AnonPeakKiB, r.RSSPeakKiB = s.anonPeak.Load(), s.rssPeak.Load()
	if n := len(s.anon); n >= 8 {
		r.AnonMedianKiB = median(s.anon)
		r.AnonDriftKiB = int64(median(s.anon[3*n/4:])) - int64(median(s.anon[n/4:n/2]))
	}
	if st, err := procStatus(s.pid); err == nil {
		r.AnonAfterKiB = st["RssAnon"]
	}
}

// spanPeaks returns the peak RssAnon of the samples taken while the
// load had done at most span (first) and of those taken once it had done
// at least total-span (last), with the number of samples of each; both 0
// without progress or when total is under twice span. A server whose
// memory is a budget, not a share of what it was sent, peaks alike in
// both: the last span is as long as the first, so the collector's peaks
// have as many chances in each, where a run's peak over all its samples
// rises with its length alone.
func (s *rssSampler) spanPeaks(span, total uint64) (first, last uint64, nFirst, nLast int) {
	if len(s.told) != len(s.anon) || span == 0 || total < 2*span {
		return 0, 0, 0, 0
	}
	for i, d := range s.told {
		switch {
		case d <= span:
			first, nFirst = max(first, s.anon[i]), nFirst+1
		case d >= total-span:
			last, nLast = max(last, s.anon[i]), nLast+1
		}
	}
	return first, last, nFirst, nLast
}

// procStatus reads the kB fields of /proc/<pid>/status (VmRSS, RssAnon,
// RssFile, ...), in KiB.
func procStatus(pid int) (map[string]uint64, error) {
	out, err := procFields(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("reading the server's memory: %w", err)
	}
	if _, ok := out["RssAnon"]; !ok {
		return nil, fmt.Errorf("no RssAnon in /proc/%d/status", pid)
	}
	return out, nil
}

// procFields reads the "key: number" lines of a /proc file (status, io),
// a number followed by " kB" as that many KiB; lines of other values are
// left out.
func procFields(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range splitLines(b) {
		k, v, ok := cutColon(line)
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSuffix(v, " kB"), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// scrapeMetrics reads the named gauges and counters from
// http://addr/metrics; names absent are absent from the result.
func scrapeMetrics(ctx context.Context, addr string, names []string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// median returns the median of xs, which it does not change.
func median(xs []uint64) uint64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
