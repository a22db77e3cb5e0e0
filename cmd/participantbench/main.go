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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// env is what the bench may touch of the process, so that tests run it in
// process.
type env struct {
	stdout, stderr io.Writer
}

// exitError ends the process with code after printing err, if any.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitUsage is the exit status of a usage error: run prints the error and
// one line pointing at -h, never the whole help.
const exitUsage = 2

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:]))
}

// run runs the bench with args (without the program's name) and returns
// the exit status.
func run(ctx context.Context, e *env, args []string) int {
	err := runBench(ctx, e, args)
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintf(e.stderr, "participantbench: %v\n", ee.err)
		}
		if ee.code == exitUsage {
			fmt.Fprintf(e.stderr, "participantbench -h describes its flags.\n")
		}
		return ee.code
	default:
		fmt.Fprintf(e.stderr, "participantbench: %v\n", err)
		return 1
	}
}

// newFlagSet returns the bench's flag set, printing usage on -h (and only
// then: parse turns a bad flag into a one-line usage error).
func newFlagSet(e *env) *flag.FlagSet {
	fs := flag.NewFlagSet("participantbench", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: participantbench %s\n\nflags:\n", usage)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args into fs. On -h it prints fs's usage and returns
// flag.ErrHelp; a parse failure is a usage error carrying the flag
// package's reason, which run prints with a pointer to -h. The flag package
// would print the reason and then the whole usage: parse silences it while
// it runs.
func parse(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	return &exitError{code: exitUsage, err: err}
}
