// Command participantd is the participantd server: it serves the wire
// protocol of docs/PROTOCOL.md on an embedded store (a
// write-ahead log checkpointed into bbolt; --store bbolt: bbolt alone), with health,
// readiness and Prometheus metrics on a second listener, and drains on
// SIGTERM or SIGINT. Run it with --help for every setting; the server itself
// is package server, which other programs may embed.
//
// Besides serving it has three flag-only modes: --version prints the build,
// --healthcheck probes a running server's /ready (for container health
// checks, where the image has no HTTP client), and --generate-token prints
// a new random token for --auth-token-file or --admin-token-file.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/participantd/participantd/internal/buildinfo"
	"github.com/participantd/participantd/internal/heapgoal"
	"github.com/participantd/participantd/server"
)

// testHook, when set, adjusts the server's configuration before it starts.
// Only a binary built with the faulthook build tag sets it (faulthook.go),
// for the end-to-end tests of package e2e; a release build has none.
var testHook func(*server.Config, zerolog.Logger)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit status (0 after a
// clean drain, 1 on failure, a failed store included, 2 on a usage error or
// a second signal).
func run(args, environ []string, stdout io.Writer, stderr *os.File) int {
	o, err := parseOptions(args, environ, stderr)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "participantd: %v\nparticipantd -h lists every setting.\n", err)
		return 2
	}
	switch {
	case o.generateToken:
		tok, err := generateToken()
		if err != nil {
			fmt.Fprintf(stderr, "participantd: generate-token: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, tok)
		return 0
	case o.version:
		fmt.Fprint(stdout, buildinfo.Read().String("participantd"))
		return 0
	case o.healthcheck:
		if err := healthcheck(o.server.HealthListen, o.server.HealthTLSCert != "", 5*time.Second); err != nil {
			fmt.Fprintf(stderr, "participantd: healthcheck: %v\n", err)
			return 1
		}
		return 0
	}
	log := newLogger(stderr, o.logLevel, o.logFormat)
	o.server.Logger = log
	logConfig(log, o)
	for _, w := range o.warnings {
		log.Warn().Msg(w)
	}
	if testHook != nil {
		testHook(&o.server, log)
	}

	if o.otlpEndpoint != "" {
		tp, err := startTracing(context.Background(), o.otlpEndpoint, log)
		if err != nil {
			log.Error().Err(err).Msg("cannot start")
			return 1
		}
		o.server.TracerProvider = tp
		// Run returns once the server has drained: flushing then sends
		// the spans of the last answers too.
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil {
				log.Warn().Err(err).Msg("tracing: flushing the last spans failed")
			}
		}()
	}
	srv, err := server.New(o.server)
	if err != nil {
		log.Error().Err(err).Msg("cannot start")
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.heapGoal == heapGoalMedian {
		// Started once the server is ready: a start's replay grows the
		// live heap from nothing, which the runtime's own goal follows
		// best. And after server.New has read GOMEMLIMIT for
		// --max-conversations auto: the follower's limit is not the
		// operator's. Run puts the operator's back before it returns.
		follower := heapgoal.New(heapgoal.Options{Logger: log})
		done := make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-srv.Ready():
				follower.Run(ctx)
			case <-ctx.Done():
			}
		}()
		defer func() { <-done }()
		defer cancel()
	}
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
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer func() {
		signal.Stop(hup)
		close(hup)
	}()
	go func() {
		for range hup {
			if err := srv.ReloadTLS(); err != nil {
				log.Error().Err(err).Msg("SIGHUP: reloading the TLS certificates failed; serving the previous ones")
				continue
			}
			log.Info().Msg("SIGHUP: TLS certificates reloaded")
		}
	}()
	if err := srv.Run(ctx); err != nil {
		log.Error().Err(err).Msg("participantd failed")
		return 1
	}
	return 0
}

// newLogger logs to w: JSON lines, or human-readable lines for format
// "console", or for "auto" when w is a terminal. Console lines are coloured
// only on a terminal: in a file or a pipe the escape codes would be noise
// in every line. Durations are logged in milliseconds, in fields named *_ms.
func newLogger(w *os.File, level zerolog.Level, format string) zerolog.Logger {
	zerolog.DurationFieldUnit = time.Millisecond
	var out io.Writer = w
	tty := isatty.IsTerminal(w.Fd())
	if format == "console" || (format == "auto" && tty) {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !tty}
	}
	return zerolog.New(out).Level(level).With().Timestamp().Str("service", "participantd").Logger()
}

// logConfig logs the build and the effective configuration, one line,
// secrets redacted: what an operator checks first when something is off.
func logConfig(log zerolog.Logger, o options) {
	bi := buildinfo.Read()
	cfg := zerolog.Dict()
	from := zerolog.Dict()
	for _, s := range o.effective {
		cfg.Str(s.name, s.value)
		if s.from != "default" {
			from.Str(s.name, s.from)
		}
	}
	log.Info().Str("version", server.Version).Str("revision", bi.Revision).Str("go", bi.GoVersion).
		Bool("tls", o.server.TLSCert != "").Bool("auth", o.server.AuthToken != "").
		Dict("config", cfg).Dict("config_from", from).Msg("starting")
}

// healthcheck asks GET /ready of the health listener at addr, over HTTPS
// when overTLS, and returns nil on 200. An unspecified host (0.0.0.0, [::]
// or none) means this machine.
func healthcheck(addr string, overTLS bool, timeout time.Duration) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("health-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	scheme := "http"
	c := &http.Client{Timeout: timeout}
	if overTLS {
		// The probe runs on the server's own machine and reads only
		// /ready: whose certificate answers does not matter to it.
		scheme = "https"
		c.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	}
	url := scheme + "://" + net.JoinHostPort(host, port) + "/ready"
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var body server.Readiness
		if json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body) == nil && body.Reason != "" {
			return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body.Reason)
		}
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
