// Command participantbench measures participantd: durable operations per
// second, latency percentiles and operations per store commit under a
// pipelined load, against a running server (--addr) or one it starts in
// process (--embedded), over TCP or WebSocket (--ws). Its other modes time
// a server to ready on data directories it builds (--startup-records) and
// measure the memory of idle connections (--idle-connections). For
// reference on the same disk in the same run it measures the raw
// write+fsync rate (--fsync-probe) and an embedded etcd's put rate
// (--etcd-compare). BENCHMARKS.md holds its figures, each with the command
// line that produced it; `participantbench -h` describes every flag.
//
// It is a command of its own, not a subcommand of participantctl, because
// --etcd-compare links an etcd server: the operator's CLI stays without one
// (cmd/participantctl's deps_test.go keeps it so).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/participantd/participantd/internal/cli"
)

// env is what the bench may touch of the process, so that tests run it in
// process.
type env struct {
	stdout, stderr io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:]))
}

// run runs the bench with args (without the program's name) and returns
// the exit status.
func run(ctx context.Context, e *env, args []string) int {
	return cli.Status(runBench(ctx, e, args), e.stderr, "participantbench", "participantbench -h describes its flags.")
}

// newFlagSet returns the bench's flag set, printing usage on -h (and only
// then: cli.Parse turns a bad flag into a one-line usage error).
func newFlagSet(e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("participantbench", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: participantbench %s\n\nflags:\n", usage)
		fs.PrintDefaults()
	}
	return fs
}
