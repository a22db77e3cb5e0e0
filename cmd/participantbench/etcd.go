package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// etcdFigure is the put rate of an embedded single-node etcd on the same
// machine and disk, measured in the same run as the participantd figures:
// the reference the targets are stated against.
type etcdFigure struct {
	Clients   int     `json:"clients"`
	Conns     int     `json:"conns"`
	Payload   int     `json:"payload_bytes"`
	Seconds   float64 `json:"seconds"`
	Puts      uint64  `json:"puts"`
	PutsPerS  float64 `json:"puts_per_s"`
	Latency   summary `json:"latency"`
	Errors    uint64  `json:"errors"`
	FirstErr  string  `json:"first_error,omitempty"`
	RatioOps  float64 `json:"participantd_ops_per_etcd_put,omitempty"`
	RatioP99  float64 `json:"participantd_p99_per_etcd_p99,omitempty"`
	EtcdDir   string  `json:"data_dir"`
	EtcdFsync bool    `json:"fsync"`
}

// freeLoopbackURL returns http://127.0.0.1:<a free port>.
func freeLoopbackURL() (url.URL, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer ln.Close()
	return url.URL{Scheme: "http", Host: ln.Addr().String()}, nil
}

// etcdPutBench starts an embedded etcd in a new directory under parent
// (fsync on, as etcd ships) and drives it as etcd's own benchmark put does:
// clients goroutines over nconns client connections shared round robin
// (nconns <= 0 or above clients: one each), each putting a payload of
// size bytes to its own keys one at a time, for warmup then d.
func etcdPutBench(ctx context.Context, parent string, clients, nconns, size int, warmup, d time.Duration) (*etcdFigure, error) {
	if nconns <= 0 || nconns > clients {
		nconns = clients
	}
	dir, err := os.MkdirTemp(parent, "etcd-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	peer, err := freeLoopbackURL()
	if err != nil {
		return nil, err
	}
	client, err := freeLoopbackURL()
	if err != nil {
		return nil, err
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("embedded etcd: not ready after 30s")
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	conns := make([]*clientv3.Client, nconns)
	for i := range conns {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcd client: %w", err)
		}
		defer c.Close()
		conns[i] = c
	}
	fig := &etcdFigure{Clients: clients, Conns: nconns, Payload: size, EtcdDir: dir, EtcdFsync: !cfg.UnsafeNoFsync}
	value := string(make([]byte, size))
	var measuring atomic.Bool
	var puts, errs atomic.Uint64
	var firstErr atomic.Pointer[string]
	lats := make([]latencies, clients)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range clients {
		c := conns[i%nconns]
		wg.Go(func() {
			for n := 0; runCtx.Err() == nil; n++ {
				t0 := time.Now()
				_, err := c.Put(runCtx, fmt.Sprintf("bench/%03d/%09d", i, n), value)
				if runCtx.Err() != nil {
					return
				}
				if err != nil {
					errs.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				if measuring.Load() {
					puts.Add(1)
					lats[i] = append(lats[i], time.Since(t0))
				}
			}
		})
	}
	sleep(ctx, warmup)
	measuring.Store(true)
	t0 := time.Now()
	sleep(ctx, d)
	measuring.Store(false)
	elapsed := time.Since(t0)
	stop()
	wg.Wait()
	var all latencies
	for _, l := range lats {
		all = append(all, l...)
	}
	fig.Seconds = elapsed.Seconds()
	fig.Puts = puts.Load()
	fig.PutsPerS = float64(fig.Puts) / fig.Seconds
	fig.Latency = all.summary()
	fig.Errors = errs.Load()
	if p := firstErr.Load(); p != nil {
		fig.FirstErr = *p
	}
	return fig, nil
}
