package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// putBench is `etcd-dev put-bench`: the reference participantd's cluster
// mode is compared with. --clients goroutines put --payload-byte values
// to keys of their own, each waiting for its put before the next (etcd
// batches concurrent proposals itself), for --duration after --warmup; it
// prints puts/s and latency percentiles.
func putBench(args []string) int {
	fs := flag.NewFlagSet("put-bench", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "comma-separated etcd client URLs")
	clients := fs.Int("clients", 64, "concurrent putters")
	conns := fs.Int("conns", 1, "etcd client connections the putters share")
	payload := fs.Int("payload", 200, "value size, bytes")
	duration := fs.Duration("duration", 10*time.Second, "measured time")
	warmup := fs.Duration("warmup", 2*time.Second, "load before measuring")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *endpoints == "" || *clients < 1 || *conns < 1 {
		fmt.Fprintln(os.Stderr, "etcd-dev put-bench: --endpoints is required; --clients and --conns at least 1")
		return 2
	}
	clis := make([]*clientv3.Client, *conns)
	for i := range clis {
		cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd-dev put-bench: %v\n", err)
			return 1
		}
		defer cli.Close()
		clis[i] = cli
	}
	val := strings.Repeat("x", *payload)
	var measuring, done atomic.Bool
	var count, errs atomic.Uint64
	lats := make([][]time.Duration, *clients)
	var wg sync.WaitGroup
	for w := range *clients {
		wg.Go(func() {
			cli := clis[w%len(clis)]
			for i := 0; !done.Load(); i++ {
				began := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := cli.Put(ctx, fmt.Sprintf("/put-bench/%d/%d", w, i), val)
				cancel()
				if !measuring.Load() {
					continue
				}
				if err != nil {
					errs.Add(1)
					continue
				}
				count.Add(1)
				lats[w] = append(lats[w], time.Since(began))
			}
		})
	}
	time.Sleep(*warmup)
	measuring.Store(true)
	start := time.Now()
	time.Sleep(*duration)
	measuring.Store(false)
	elapsed := time.Since(start)
	done.Store(true)
	wg.Wait()
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(p*float64(len(all))))]
	}
	fmt.Printf("etcd put: %d clients, %d B values: %.0f puts/s, p50 %v, p99 %v, errors %d\n",
		*clients, *payload, float64(count.Load())/elapsed.Seconds(), pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), errs.Load())
	return 0
}
