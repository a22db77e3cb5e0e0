package server_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

// BenchmarkConnectionMemory reports what an idle connection costs the
// process (issue 27, finding 3): heap and goroutine stacks per socket
// that sent nothing (before hello, when nobody is authenticated) and per
// welcomed connection that does nothing. The dialing side lives in the
// same process, so each figure includes its socket (about half a KiB).
//
//	go test -run '^$' -bench ConnectionMemory ./server/
func BenchmarkConnectionMemory(b *testing.B) {
	const sockets = 500
	for _, welcomed := range []bool{false, true} {
		name := "pre-hello"
		if welcomed {
			name = "welcomed"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				b.ReportMetric(connectionMemory(b, sockets, welcomed), "B/conn")
			}
		})
	}
}

// connectionMemory opens n idle connections to a fresh server and
// returns the heap and stack bytes in use per connection.
func connectionMemory(b *testing.B, n int, welcomed bool) float64 {
	b.Helper()
	srv, err := server.New(server.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0",
		HelloTimeout: time.Hour, IdleTimeout: -1})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-srv.Ready()
	before := inUse()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	hello := wire.AppendFrame(nil, &wire.Hello{Versions: []uint64{1}})
	for range n {
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, nc)
		if welcomed {
			if _, err := nc.Write(hello); err != nil {
				b.Fatal(err)
			}
			r := wire.NewReader(bufio.NewReaderSize(nc, 16), 1<<20)
			if _, err := r.ReadFrame(); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Every connection is accepted and, when welcomed, its goroutines
	// started: the open count says so.
	for open(b, srv) < float64(n) {
		runtime.Gosched()
	}
	after := inUse()
	return float64(after-before) / float64(n)
}

// inUse is the heap and goroutine stack bytes in use after a collection.
func inUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// open reads participantd_connections_open (both transports) from
// /metrics.
func open(b *testing.B, srv *server.Server) float64 {
	resp, err := http.Get("http://" + srv.HealthAddr().String() + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), server.MetricConnectionsOpen+"{"); ok {
			f, _ := strconv.ParseFloat(v[strings.IndexByte(v, ' ')+1:], 64)
			total += f
		}
	}
	return total
}
