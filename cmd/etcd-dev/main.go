// Command etcd-dev runs a small etcd cluster in one process, for trying
// participantd's cluster mode on one machine when no etcd binary is
// installed: N members (default 3) on loopback, data under --data, client
// URLs printed on stdout as one comma-separated line (what
// participantd --etcd-endpoints takes). It runs until SIGINT or SIGTERM.
//
// `etcd-dev put-bench --endpoints URLS` is the plain etcd put benchmark that
// BENCHMARKS.md compares cluster mode with.
//
// It is a development tool: a real deployment runs etcd members on
// separate machines.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "put-bench" {
		os.Exit(putBench(os.Args[2:]))
	}
	members := flag.Int("members", 3, "number of etcd members")
	data := flag.String("data", "etcd-dev-data", "directory of the members' data (one subdirectory each)")
	logLevel := flag.String("log-level", "", "etcd log level (debug, info, warn, error; empty: none)")
	flag.Parse()
	if *members < 1 {
		fmt.Fprintln(os.Stderr, "etcd-dev: --members must be at least 1")
		os.Exit(2)
	}
	if err := os.MkdirAll(*data, 0o700); err != nil {
		fmt.Fprintf(os.Stderr, "etcd-dev: %v\n", err)
		os.Exit(1)
	}
	c, err := etcdtest.Start(*data, etcdtest.Options{Members: *members, LogLevel: *logLevel})
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-dev: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(strings.Join(c.Endpoints(), ","))
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
	c.Close()
}
