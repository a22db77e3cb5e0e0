package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// The offline tools read a stopped server's data directory. They open the
// store read-only (store.Options.ReadOnly: O_RDONLY, a shared lock, no
// layout transaction), so the data is exactly as the server left it, byte
// for byte, and a missing or empty store is an error, never a new store.
// What they report comes from participant.Inspect, the server's own
// reconciliation run in dry mode, after store.Bolt.Check read every page.

// storeFile is the store's file name inside the data directory.
const storeFile = server.StoreFile

// offlineLockTimeout is how long to wait for the data file's lock: a running
// server holds it for good, so waiting long only delays the diagnosis.
const offlineLockTimeout = 200 * time.Millisecond

func addDataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", "./data", "the stopped server's data directory")
}

// openData opens the store of data directory dir read-only. It reports a
// running server (store.ErrLocked), a missing or empty store
// (store.ErrNoData) and a damaged one (store.ErrCorrupt) plainly.
func openData(dir string) (*store.Bolt, error) {
	path := filepath.Join(dir, storeFile)
	st, err := store.Open(path, store.Options{LockTimeout: offlineLockTimeout, ReadOnly: true})
	switch {
	case err == nil:
		return st, nil
	case errors.Is(err, store.ErrLocked):
		return nil, fmt.Errorf("%s is in use: stop participantd first (the offline tools need the data at rest): %w", dir, err)
	case errors.Is(err, store.ErrNoData):
		return nil, fmt.Errorf("no store in %s: %w", dir, err)
	case errors.Is(err, store.ErrCorrupt):
		return nil, damaged(err)
	}
	return nil, err
}

// damaged explains a damaged store to the operator.
func damaged(err error) error {
	return fmt.Errorf("%w\nThe store is damaged: restore %s from a backup, or move the data directory aside to start empty (its history is then lost)", err, storeFile)
}

// openLog opens the log-first store of data directory dir read-only: the
// bbolt file with the write-ahead log replayed over it in memory, so that
// nothing on disk changes. It returns nil, nil when dir has no log (a
// server run on bbolt alone); a corrupt log fails with an error naming
// the segment and offset.
func openLog(dir string) (*logfirst.Store, error) {
	segs, err := filepath.Glob(filepath.Join(dir, logfirst.WALDir, "*"))
	if err != nil || len(segs) == 0 {
		return nil, err
	}
	st, err := logfirst.OpenReadOnly(dir, logfirst.Options{LockTimeout: offlineLockTimeout})
	if errors.Is(err, store.ErrLocked) {
		return nil, fmt.Errorf("%s is in use: stop participantd first (the offline tools need the data at rest): %w", dir, err)
	}
	return st, err
}

// inspectData reconciles the data directory dir in dry run: the server
// incarnation recorded there and what participant.Inspect reports.
func inspectData(dir string) (incarnation uint64, reports []participant.Report, err error) {
	st, err := openData(dir)
	if err != nil {
		return 0, nil, err
	}
	defer st.Close()
	if err := st.Check(); err != nil {
		if errors.Is(err, store.ErrCorrupt) {
			return 0, nil, damaged(err)
		}
		return 0, nil, err
	}
	// The file is sound; what the server would start from is the file
	// with its log replayed over it, when it has one.
	var view store.DurableStore = st
	lg, err := openLog(dir)
	if err != nil {
		return 0, nil, err
	}
	if lg != nil {
		defer lg.Close()
		view = lg
	}
	if incarnation, err = view.ReadValue(participant.IncarnationKey); err != nil {
		return 0, nil, fmt.Errorf("read incarnation: %w", err)
	}
	reports, err = participant.Inspect(view)
	if errors.Is(err, store.ErrCorrupt) {
		err = damaged(err)
	}
	return incarnation, reports, err
}
