// Command etcd-dev runs a small etcd cluster in one process, for trying
// participantd's cluster mode on one machine when no etcd binary is
// installed: N members (default 3) on loopback, data under --data, client
// URLs printed on stdout as one comma-separated line (what
// participantd --etcd-endpoints takes). It runs until SIGINT or SIGTERM.
// The members' addresses are recorded in the data directory (etcd-dev.json)
// when it is created, and a later run on the same directory listens on
// them again: an etcd member's peer address is part of the membership its
// data holds.
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
	l, existing, err := loadOrCreateLayout(*data, *members)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-dev: %v\n", err)
		os.Exit(1)
	}
	if existing {
		fmt.Fprintf(os.Stderr, "etcd-dev: restarting the %d members of %s on the ports they were created with\n", len(l.Members), *data)
	}
	running, err := startMembers(*data, l, existing, *logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd-dev: %v\n", err)
		os.Exit(1)
	}
	var endpoints []string
	for _, m := range l.Members {
		endpoints = append(endpoints, m.Client)
	}
	fmt.Println(strings.Join(endpoints, ","))
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
	for _, e := range running {
		e.Close()
	}
}
