package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/cmd/participantd/server"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// The offline tools read a stopped server's data directory. They open the
// store, read it and close it: they never Append, CAS or Flush, so the
// data is exactly as the server left it.
// What they report comes from participant.Inspect, the server's own
// reconciliation run in dry mode.

// storeFile is the store's file name inside the data directory.
const storeFile = server.StoreFile

// offlineLockTimeout is how long to wait for the data file's lock: a running
// server holds it for good, so waiting long only delays the diagnosis.
const offlineLockTimeout = 200 * time.Millisecond

func addDataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", "./data", "the stopped server's data directory")
}

// openData opens the store of data directory dir for reading: the bbolt
// file read-only with the log replayed over it in memory, so that nothing
// on disk changes. It refuses a directory without a store and reports a
// running server (store.ErrLocked) plainly; a corrupt log fails with an
// error naming the segment and offset.
func openData(dir string) (*logfirst.Store, error) {
	path := filepath.Join(dir, storeFile)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no store in %s: %w", dir, err)
	}
	st, err := logfirst.OpenReadOnly(dir, logfirst.Options{LockTimeout: offlineLockTimeout})
	if errors.Is(err, store.ErrLocked) {
		return nil, fmt.Errorf("%s is in use: stop participantd first (the offline tools need the data at rest): %w", dir, err)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// inspectData reconciles the data directory dir in dry run: the server
// incarnation recorded there and what participant.Inspect reports.
func inspectData(dir string) (incarnation uint64, reports []participant.Report, err error) {
	st, err := openData(dir)
	if err != nil {
		return 0, nil, err
	}
	defer st.Close()
	if incarnation, err = st.ReadValue(participant.IncarnationKey); err != nil {
		return 0, nil, fmt.Errorf("read incarnation: %w", err)
	}
	reports, err = participant.Inspect(st)
	return incarnation, reports, err
}
