//go:build faulthook

package main

import (
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
)

// ClockOffsetFileEnv names the environment variable of the clock hook (not
// PARTICIPANTD_*: the settings refuse unknown ones of those): the
// file it names holds a Go duration (say "-90s") that the service's wall
// clock is offset by, read at start and again on every SIGUSR2, so that a
// test can skew one node's clock against the others' and step it forward
// or back during a run.
const ClockOffsetFileEnv = "PDTEST_CLOCK_OFFSET_FILE"

// This file is a TEST HOOK, compiled only with `go build -tags faulthook`
// (the end-to-end tests of package e2e and the robustness suite do that);
// a release build does not contain it. Such a binary:
//
//   - wraps its single-node store in a faultstore whose flushes hang (as on
//     a dead disk) from the first SIGUSR1 on, for good: a test can then
//     prove that SIGTERM still ends the process within --drain-timeout +
//     --store-close-timeout;
//   - offsets the service's wall clock by the duration in the file named
//     by $PDTEST_CLOCK_OFFSET_FILE, if set, re-read on SIGUSR2.
func init() {
	testHook = func(cfg *server.Config, log zerolog.Logger) {
		hang := faultstore.NewSwitch(faultstore.OnKind(faultstore.OpFlush, faultstore.Hang))
		cfg.WrapStore = func(st store.DurableStore) store.DurableStore {
			fs := faultstore.New(st)
			fs.SetRules(hang)
			return fs
		}
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		// Lives as long as the process, which is what it drills.
		go func() {
			<-usr1
			log.Warn().Msg("test hook: every store flush hangs from now on")
			hang.Set(true)
		}()
		if file := os.Getenv(ClockOffsetFileEnv); file != "" {
			cfg.Now = clockHook(file, log)
		}
	}
}

// clockHook returns a clock offset by the duration in file, re-read on
// every SIGUSR2. A file that cannot be read or parsed leaves the offset as
// it was (logged).
func clockHook(file string, log zerolog.Logger) func() time.Time {
	var offset atomic.Int64
	load := func() {
		b, err := os.ReadFile(file)
		if err != nil {
			log.Warn().Err(err).Msg("test hook: clock offset unchanged")
			return
		}
		d, err := time.ParseDuration(strings.TrimSpace(string(b)))
		if err != nil {
			log.Warn().Err(err).Msg("test hook: clock offset unchanged")
			return
		}
		offset.Store(int64(d))
		log.Warn().Dur("clock_offset", d).Msg("test hook: the service's clock is offset")
	}
	load()
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	go func() {
		for range usr2 {
			load()
		}
	}()
	return func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
}
