package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/vfs"
)

// LockFile is the data directory's lock file: a participantd holds an
// exclusive flock on it from before it reads anything in the directory
// until it has closed the store.
const LockFile = "LOCK"

// Errors of opening a data directory; each names the directory or file and
// says what the operator can do.
var (
	// ErrDataDirLocked reports a data directory another participantd (or
	// another Server of this process) holds.
	ErrDataDirLocked = errors.New("server: data directory is in use by another participantd")
	// ErrStoreLost reports a store that is missing or empty although the
	// directory has had a life before (its node.key exists).
	ErrStoreLost = errors.New("server: the store is missing or empty but the data directory was used before")
	// ErrNodeKeyLost reports a store that was served before without the
	// node.key it was served with.
	ErrNodeKeyLost = errors.New("server: node.key is missing but the store was served before")
	// ErrStoreDamaged reports a store file that fails the checks of
	// boltstore.Open (store.ErrCorrupt).
	ErrStoreDamaged = errors.New("server: the store is damaged")
	// ErrDataDirExposed reports a data directory or a file in it that
	// other users of the host may read or change: the store holds enroll
	// and attach tokens whose replay returns participant secrets, and
	// node.key derives every secret.
	ErrDataDirExposed = errors.New("server: the data directory is open to other users")
	// ErrLogPending reports a data directory opened with EngineBolt whose
	// write-ahead log holds records the store file does not: serving the
	// file alone would lose acknowledged writes.
	ErrLogPending = errors.New("server: the write-ahead log holds writes the store file does not")
)

// The store engines of a single node (Config.Engine).
const (
	// EngineBolt is bbolt alone: every group commit is a bbolt
	// transaction.
	EngineBolt = "bbolt"
	// EngineLog is the log-first store (package logfirst): a write-ahead
	// log, one fdatasync per group commit, checkpointed into the same
	// bbolt file. The default.
	EngineLog = "log"
)

// dataStore is what the data directory's store offers the server.
type dataStore interface {
	store.DurableStore
	Stats() store.Stats
	// InUse is the bytes the store holds, its file's free pages not
	// counted: what MaxDataBytes caps.
	InUse() (int64, error)
}

// dataDir is an open data directory: held locked, with its node key and
// its store. Close releases them.
type dataDir struct {
	lock *os.File // nil where flock is not available
	key  []byte
	path string // the bbolt file
	st   dataStore
	// backup is st's online backup: boltstore.Store's or logfirst.Store's.
	backup backuper
}

var (
	_ backuper = (*boltstore.Store)(nil)
	_ backuper = (*logfirst.Store)(nil)
)

// errNoBackup is Backup's answer for an engine without an online backup.
var errNoBackup = errors.New("server: this store engine has no online backup")

// openDataDir creates the data directory (mode 0700) if absent, locks it,
// checks that other users may not read it (checkDataDirModes),
// then opens the store and the node key, refusing what would silently
// start over from an empty store or void every credential:
//
//	node.key  participantd.db           served before  outcome
//	absent    absent or 0 bytes         -              fresh: both created
//	present   absent or 0 bytes         -              ErrStoreLost
//	absent    valid                     no             node.key created
//	absent    valid                     yes            ErrNodeKeyLost
//	any       damaged (store.ErrCorrupt) -             ErrStoreDamaged
//
// "Served before" is a server incarnation above 0: participant.Open
// advances it only after the node key is durable, so a crash during a
// first start (store created, key not yet) is not mistaken for a lost key.
// The lock is taken before anything else is read, so two processes on one
// directory never both decide; the node key is created exclusively
// (participant.LoadOrCreateNodeKey) after the lock, so the key served is
// the key on disk.
func openDataDir(dir string, cfg Config, log zerolog.Logger) (*dataDir, error) {
	// vfs.MkdirAll syncs the parent of each directory it creates: a data
	// directory whose entry a crash can lose takes every synced file in
	// it along.
	if err := vfs.MkdirAll(vfs.OS, dir); err != nil {
		return nil, fmt.Errorf("server: data directory: %w", err)
	}
	lock, err := lockDataDir(dir, boltstore.DefaultLockTimeout)
	if err != nil {
		return nil, err
	}
	d := &dataDir{lock: lock}
	if err := checkDataDirModes(dir, log); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.open(dir, cfg, log); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func (d *dataDir) open(dir string, cfg Config, log zerolog.Logger) error {
	keyPath := filepath.Join(dir, participant.NodeKeyFile)
	path := filepath.Join(dir, StoreFile)
	_, err := os.Stat(keyPath)
	keyExists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("server: node key: %w", err)
	}
	d.path = path
	st, err := openEngine(dir, path, cfg, keyExists, log)
	switch {
	case errors.Is(err, store.ErrNoData):
		return fmt.Errorf("%w: %w; %s exists, so this directory has held data: restore %s from a backup; "+
			"or, if a first start was interrupted or the history is to be given up, move the data directory aside to start empty",
			ErrStoreLost, err, keyPath, path)
	case errors.Is(err, store.ErrCorrupt):
		return fmt.Errorf("%w: %w; restore %s from a backup, or move the data directory aside to start empty (its history is then lost); "+
			"participantctl verify --data %s describes the damage", ErrStoreDamaged, err, path, dir)
	case errors.Is(err, store.ErrLocked):
		return fmt.Errorf("%w: %w", ErrDataDirLocked, err)
	case err != nil:
		return fmt.Errorf("server: store: %w", err)
	}
	d.st = st
	d.backup, _ = st.(backuper)
	if !keyExists {
		inc, err := st.ReadValue(participant.IncarnationKey)
		if err != nil {
			return fmt.Errorf("server: store: %w", err)
		}
		if inc > 0 {
			return fmt.Errorf("%w: %s was served by %d server incarnations, and every credential it issued depends on the key: "+
				"restore %s from a backup; a new key would void every credential", ErrNodeKeyLost, path, inc, keyPath)
		}
	}
	if d.key, err = participant.LoadOrCreateNodeKey(dir); err != nil {
		return fmt.Errorf("server: node key: %w", err)
	}
	return nil
}

// openEngine opens the store of engine in dir, its bbolt file at path; a
// missing or empty file is store.ErrNoData when mustExist.
func openEngine(dir, path string, cfg Config, mustExist bool, log zerolog.Logger) (dataStore, error) {
	switch cfg.Engine {
	case EngineLog:
		// logfirst.Open runs boltstore.Open's checks on the bbolt file before
		// it maps it, with the same errors.
		st, err := logfirst.Open(dir, logfirst.Options{Logger: log, MustExist: mustExist, MaxUncheckpointed: int64(cfg.LogMemoryBytes), SegmentSize: int64(cfg.WALSegmentSize)})
		if err != nil {
			return nil, err
		}
		rp := st.Replay()
		log.Info().Int("records", rp.Log.Records).Uint64("checkpoint_lsn", uint64(rp.CheckpointLSN)).
			Bool("torn_tail_cut", rp.Log.Torn).Int64("duration_ms", rp.Duration.Milliseconds()).Msg("log replayed")
		return st, nil
	default:
		if err := checkNoPendingLog(dir, path); err != nil {
			return nil, err
		}
		return boltstore.Open(path, boltstore.Options{MustExist: mustExist})
	}
}

// checkNoPendingLog refuses, with ErrLogPending, a directory whose log (a
// run of EngineLog that did not close cleanly) holds records after the
// store file's checkpoint: EngineBolt would serve the file without them.
// A directory without log segments, or whose log the file covers, passes,
// unless its log was made durable and is now lost (logfirst.ErrLogLost).
func checkNoPendingLog(dir, path string) error {
	segs, err := filepath.Glob(filepath.Join(dir, logfirst.WALDir, "*.wal"))
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		// No log, unless one was made durable here and is now lost:
		// OpenReadOnly refuses that (logfirst.ErrLogLost).
		if _, err := os.Stat(filepath.Join(dir, logfirst.LogMarkerFile)); err != nil {
			return nil
		}
	}
	st, err := logfirst.OpenReadOnly(dir, logfirst.Options{})
	if errors.Is(err, logfirst.ErrLogLost) {
		return err
	}
	if err != nil {
		// boltstore.Open reports a missing or damaged file itself; a corrupt
		// log is refused here.
		if errors.Is(err, store.ErrNoData) || errors.Is(err, store.ErrCorrupt) {
			return nil
		}
		return err
	}
	rp := st.Replay()
	if err := st.Close(); err != nil {
		return err
	}
	if rp.Log.Records > 0 {
		return fmt.Errorf("%w: %d records after checkpoint LSN %v in %s: start with --store %s, which applies them to %s (after that, --store %s serves it whole)",
			ErrLogPending, rp.Log.Records, rp.CheckpointLSN, filepath.Join(dir, logfirst.WALDir), EngineLog, path, EngineBolt)
	}
	return nil
}

// Backup writes a consistent copy of the store file, a bbolt file that is
// the whole store for either engine (see boltstore.Store.Backup and
// logfirst.Store.Backup); errNoBackup for an engine that has none.
func (d *dataDir) Backup(w io.Writer, begin store.BackupSize) (int64, error) {
	if d.backup == nil {
		return 0, errNoBackup
	}
	return d.backup.Backup(w, begin)
}

// Stats reports the store's counters.
func (d *dataDir) Stats() store.Stats { return d.st.Stats() }

// Close closes the store, then releases the lock. It returns the store's
// Close error.
func (d *dataDir) Close() error {
	var err error
	if d.st != nil {
		err = d.st.Close()
		d.st = nil
	}
	if d.lock != nil {
		// Closing the file releases the flock.
		d.lock.Close()
		d.lock = nil
	}
	return err
}

// lockPollInterval is how often lockDataDir retries a held lock.
const lockPollInterval = 10 * time.Millisecond
