//go:build faulthook

package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
)

// This file is a TEST HOOK, compiled only with `go build -tags faulthook`
// (the end-to-end tests of package e2e do that); a release build does not
// contain it. Such a binary wraps its store in a faultstore whose flushes
// hang (as on a dead disk) from the first SIGUSR1 on, for good: a test
// can then prove that SIGTERM still ends the process within
// --drain-timeout + --store-close-timeout.
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
	}
}
