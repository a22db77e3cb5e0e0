package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/participantd/participantd/wire"
)

// idleReport is the memory cost of idle bound connections.
type idleReport struct {
	Connections   int     `json:"connections"`
	Embedded      bool    `json:"embedded"`
	RSSBeforeKiB  uint64  `json:"rss_before_kib"`
	RSSAfterKiB   uint64  `json:"rss_after_kib"`
	PerConnKiB    float64 `json:"rss_per_connection_kib"`
	HeapPerConnKB float64 `json:"go_heap_per_connection_kib,omitempty"`
	SetupSeconds  float64 `json:"setup_seconds"`
}

func (r *idleReport) print(b *strings.Builder) {
	where := "server process"
	if r.Embedded {
		where = "process (embedded: server plus the bench's idle sockets, which hold no goroutine or buffer)"
	}
	fmt.Fprintf(b, "idle: %d connections, each bound in its own conversation (set up in %.1f s)\n", r.Connections, r.SetupSeconds)
	fmt.Fprintf(b, "  RSS of the %s: %d KiB before, %d KiB after: %.1f KiB per connection", where, r.RSSBeforeKiB, r.RSSAfterKiB, r.PerConnKiB)
	if r.HeapPerConnKB > 0 {
		fmt.Fprintf(b, " (Go heap in use %.1f KiB per connection)", r.HeapPerConnKB)
	}
	b.WriteString("\n")
}

// runIdle opens f.idle connections, each enrolled in its own conversation,
// and reports the server's RSS growth per connection. The bench keeps only
// each socket: after the enroll answer it drops the wire.Conn's buffers and
// runs no goroutine per connection, so that in an embedded run the growth
// is (almost all) the server's.
func runIdle(ctx context.Context, f *benchFlags, rep *benchReport) error {
	if f.serverPID <= 0 {
		return errors.New("--idle-connections needs --embedded or --server-pid")
	}
	settle := func() {
		if f.embedded {
			runtime.GC()
			debug.FreeOSMemory()
		}
		time.Sleep(500 * time.Millisecond)
	}
	settle()
	before, err := rssKiB(f.serverPID)
	if err != nil {
		return err
	}
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	nonce := newNonce()
	held := make([]net.Conn, f.idle)
	start := time.Now()
	errs := make(chan error, f.idle)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range f.idle {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := dialBench(ctx, f.load.addr)
			if err != nil {
				errs <- err
				return
			}
			// One enroll per conversation: any token will do, as long as
			// a server running a token window takes it.
			tok := wire.TokenV7(time.Now().UnixMilli(), 0, 1)
			if err := c.wc.WriteMessage(&wire.Enroll{ID: 1, Conversation: nonce | uint64(i), Token: tok}); err != nil {
				c.wc.Close()
				errs <- err
				return
			}
			m, err := c.wc.ReadServerMessage()
			if err != nil {
				c.wc.Close()
				errs <- err
				return
			}
			if _, ok := m.(*wire.Enrolled); !ok {
				c.wc.Close()
				errs <- fmt.Errorf("enroll answered %s %+v", m.Type(), m)
				return
			}
			// Keep the socket only: the wire.Conn's buffers are garbage.
			held[i] = c.wc.NetConn()
		}()
	}
	wg.Wait()
	close(errs)
	setup := time.Since(start)
	defer func() {
		for _, c := range held {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := errors.Join(collect(errs)...); err != nil {
		return err
	}
	settle()
	after, err := rssKiB(f.serverPID)
	if err != nil {
		return err
	}
	ir := &idleReport{Connections: f.idle, Embedded: f.embedded, RSSBeforeKiB: before, RSSAfterKiB: after, SetupSeconds: setup.Seconds()}
	ir.PerConnKiB = (float64(after) - float64(before)) / float64(f.idle)
	if f.embedded {
		var ms1 runtime.MemStats
		runtime.ReadMemStats(&ms1)
		inUse := func(m *runtime.MemStats) float64 { return float64(m.HeapInuse + m.StackInuse) }
		ir.HeapPerConnKB = (inUse(&ms1) - inUse(&ms0)) / 1024 / float64(f.idle)
	}
	rep.Idle = ir
	return nil
}

// rssKiB reads VmRSS of pid from /proc.
func rssKiB(pid int) (uint64, error) {
	st, err := procFields(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the server's RSS: %w", err)
	}
	n, ok := st["VmRSS"]
	if !ok {
		return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return n, nil
}
