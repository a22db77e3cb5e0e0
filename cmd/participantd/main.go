// Command participantd is the participantd server: it serves the wire
// protocol of PROTOCOL.md on an embedded log-first store (a write-ahead log
// checkpointed into bbolt), with health, readiness
// and Prometheus metrics on a second listener, and drains on SIGTERM or
// SIGINT. Run it with --help for every setting; the server itself is
// package server, which other programs may embed.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/participantd/participantd/cmd/participantd/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stderr))
}

// run is main without the process: it returns the exit status (0 after a
// clean drain, 1 on failure, 2 on a usage error or a second signal).
func run(args, environ []string, stderr *os.File) int {
	o, err := parseOptions(args, environ, stderr)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "participantd: %v\n", err)
		return 2
	}
	log := newLogger(stderr, o.logLevel)
	o.server.Logger = log

	srv, err := server.New(o.server)
	if err != nil {
		log.Error().Err(err).Msg("cannot start")
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-sigs
		log.Info().Stringer("signal", sig).Msg("draining; a second signal exits at once")
		cancel()
		sig = <-sigs
		log.Warn().Stringer("signal", sig).Msg("second signal: exiting without draining")
		os.Exit(2)
	}()
	if err := srv.Run(ctx); err != nil {
		log.Error().Err(err).Msg("participantd failed")
		return 1
	}
	return 0
}

// newLogger logs JSON lines to w, or human-readable lines when w is a
// terminal.
func newLogger(w *os.File, level zerolog.Level) zerolog.Logger {
	var out io.Writer = w
	if isatty.IsTerminal(w.Fd()) {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(out).Level(level).With().Timestamp().Str("service", "participantd").Logger()
}
