package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serverCounters are the server metrics the bench reads before and after
// the measured window.
type serverCounters struct {
	Commits   float64
	Flushes   float64
	Committed float64
	// CPUSeconds is the server process's user+system CPU time.
	CPUSeconds float64
}

// scrapeCounters reads the Prometheus text of http://addr/metrics and
// returns the store and commit counters. Unknown lines are skipped.
func scrapeCounters(ctx context.Context, addr string) (serverCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return serverCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return serverCounters{}, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return serverCounters{}, fmt.Errorf("scrape metrics: %s", resp.Status)
	}
	var c serverCounters
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case "participantd_store_commits_total":
			c.Commits = v
		case "participantd_store_flushes_total":
			c.Flushes = v
		case "participantd_store_committed_ops_total":
			c.Committed = v
		case "process_cpu_seconds_total":
			c.CPUSeconds = v
		}
	}
	return c, sc.Err()
}
