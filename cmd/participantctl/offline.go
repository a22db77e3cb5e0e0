package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
)

// The offline tools read a stopped server's data directory through package
// offline: the readers open the file read-only (boltstore.Options.ReadOnly:
// O_RDONLY, a shared lock, no layout transaction) with the log replayed in
// memory over it, so the data is exactly as the server left it, byte for
// byte, and a missing or empty store is an error, never a new store; the
// writers (compact, backup --data) open it as the daemon does, the log
// replayed into the file first. What they report comes from
// participant.Inspect, the server's own reconciliation run in dry mode.

// storeFile is the store's file name inside the data directory.
const storeFile = server.StoreFile

// offlineOptions opens a data directory for the offline tools.
var offlineOptions = offline.Options{LockTimeout: offline.DefaultLockTimeout}

func addDataFlag(fs *pflag.FlagSet) *string {
	return fs.String("data", "./data", "the stopped server's data directory")
}

// explainOpen explains an error of opening data directory dir to the
// operator: a running server (store.ErrLocked), a missing or empty store
// (store.ErrNoData), a damaged one (store.ErrCorrupt).
func explainOpen(dir string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrLocked):
		return fmt.Errorf("%s is in use: stop participantd first (the offline tools need the data at rest): %w", dir, err)
	case errors.Is(err, store.ErrNoData):
		return fmt.Errorf("no store in %s: %w", dir, err)
	case errors.Is(err, store.ErrCorrupt):
		return damaged(err)
	}
	return err
}

// openData opens the bbolt file of data directory dir alone, read-only
// (inspect --space, which reports where the file's bytes go).
func openData(dir string) (*boltstore.Store, error) {
	st, err := boltstore.Open(filepath.Join(dir, storeFile), boltstore.Options{LockTimeout: offline.DefaultLockTimeout, ReadOnly: true})
	return st, explainOpen(dir, err)
}

// damaged explains a damaged store to the operator.
func damaged(err error) error {
	return fmt.Errorf("%w\nThe store is damaged: restore %s from a backup, or move the data directory aside to start empty (its history is then lost)", err, storeFile)
}

// inspectData reconciles the data directory dir in dry run
// (offline.Inspect): the server incarnation recorded there and what
// participant.Inspect reports.
func inspectData(dir string) (incarnation uint64, reports []participant.Report, err error) {
	incarnation, reports, err = offline.Inspect(dir, offlineOptions)
	return incarnation, reports, explainOpen(dir, err)
}
