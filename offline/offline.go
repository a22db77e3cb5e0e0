package offline

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/vfs"
)

// StoreFile is the bbolt file's name inside the data directory.
const StoreFile = logfirst.DBFile

// DefaultLockTimeout is how long to wait for the data file's lock when
// Options.LockTimeout is zero: a running server holds it for good, so
// waiting long only delays the diagnosis.
const DefaultLockTimeout = 200 * time.Millisecond

// Options configures how a data directory is opened. The zero value means
// the defaults.
type Options struct {
	// LockTimeout bounds the wait for the data file's lock (a running
	// server's is store.ErrLocked). Zero means DefaultLockTimeout.
	LockTimeout time.Duration
	// LogFS is the file system of the log; nil means the operating
	// system's (tests give a faultfs).
	LogFS vfs.FS
	// LogSegmentSize is the size of the log segments a writing tool
	// creates; zero means wal.DefaultSegmentSize.
	LogSegmentSize int64
}

func (o Options) withDefaults() Options {
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.LogFS == nil {
		o.LogFS = vfs.OS
	}
	return o
}

func (o Options) logfirst() logfirst.Options {
	return logfirst.Options{LockTimeout: o.LockTimeout, FS: o.LogFS, SegmentSize: o.LogSegmentSize, MustExist: true}
}

// OpenReadOnly opens the store of data directory dir without changing
// any file, as the daemon's start would find it: logfirst.OpenReadOnly,
// the file read-only and the log's records after its checkpoint, if it
// has a log, replayed in memory over it; then boltstore.Store.Check reads
// every key and value of the file. A file a power cut left as bbolt
// created it, before the first start wrote the store's layout, is the
// empty store the start would lay out. A running server is
// store.ErrLocked; a missing or empty file store.ErrNoData; a damaged
// file or log store.ErrCorrupt (or wal.ErrCorrupt, naming the segment and
// offset); a log made durable and now lost logfirst.ErrLogLost.
func OpenReadOnly(dir string, opts Options) (store.DurableStore, error) {
	o := opts.withDefaults()
	st, err := logfirst.OpenReadOnly(dir, o.logfirst())
	if err != nil {
		return nil, err
	}
	if st.Fresh() {
		// No bucket to read: its pages were walked by the open.
		return st, nil
	}
	// The shared locks of both opens keep writers out: the file is at rest.
	if err := CheckFile(filepath.Join(dir, StoreFile), opts); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// CheckFile reads the bbolt file at path whole, opened read-only under a
// shared lock: boltstore.Store.Check reads every page reachable from its meta
// page and every key and value in the store's layout. It changes no
// file. A running server holding it is store.ErrLocked; a damaged file
// store.ErrCorrupt; other errors are boltstore.Open's.
func CheckFile(path string, opts Options) error {
	o := opts.withDefaults()
	bt, err := boltstore.Open(path, boltstore.Options{LockTimeout: o.LockTimeout, ReadOnly: true})
	if err != nil {
		return err
	}
	err = bt.Check()
	if cerr := bt.Close(); err == nil {
		err = cerr
	}
	return err
}

// OpenWritable opens the store of data directory dir for an offline tool
// that writes, as the daemon's open does: in a directory the log-first
// engine started in (logfirst.Started), logfirst.Open replays the
// records after the file's checkpoint into it first, and every write
// goes through the log (Close checkpoints them into the file), or fails
// with logfirst.ErrLogLost when the log is lost; in any other, the file
// alone is the store. A file without the store's layout yet gets it, as
// at the daemon's start. It never creates a store: a missing or empty
// file is store.ErrNoData. A running server is store.ErrLocked.
func OpenWritable(dir string, opts Options) (store.DurableStore, error) {
	o := opts.withDefaults()
	logged, err := logfirst.Started(dir, o.LogFS)
	if err != nil {
		return nil, err
	}
	if logged {
		return logfirst.Open(dir, o.logfirst())
	}
	return boltstore.Open(filepath.Join(dir, StoreFile), boltstore.Options{LockTimeout: o.LockTimeout, MustExist: true})
}

// Replay returns what the log of data directory dir holds after its
// file's checkpoint, replayed in memory as a start would replay it into
// the file: how many records, in how many segments, and an unfinished
// last record. A directory the log-first engine never started in has no
// log: the zero ReplayStats. It changes no file. Errors are
// logfirst.OpenReadOnly's: a corrupt log wraps wal.ErrCorrupt, naming the
// segment and offset; a lost one is logfirst.ErrLogLost.
func Replay(dir string, opts Options) (logfirst.ReplayStats, error) {
	o := opts.withDefaults()
	logged, err := logfirst.Started(dir, o.LogFS)
	if err != nil || !logged {
		return logfirst.ReplayStats{}, err
	}
	st, err := logfirst.OpenReadOnly(dir, o.logfirst())
	if err != nil {
		return logfirst.ReplayStats{}, err
	}
	rp := st.Replay()
	return rp, st.Close()
}

// Pending reports how many records the log of data directory dir holds
// after its file's checkpoint (Replay): records the file alone does not
// hold, so that a copy of the file alone would lose them. A directory the
// log-first engine never started in has none. Errors are Replay's.
func Pending(dir string, opts Options) (int, error) {
	rp, err := Replay(dir, opts)
	return rp.Log.Records, err
}

// Inspect reconciles data directory dir in dry run, changing no file: the
// server incarnation recorded there and participant.Inspect's reports of
// the store a start would find (OpenReadOnly). Errors are OpenReadOnly's.
func Inspect(dir string, opts Options) (incarnation uint64, reports []participant.Report, err error) {
	st, err := OpenReadOnly(dir, opts)
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

// Compact checkpoints and compacts the store of data directory dir
// (participant.Compact with popts) through OpenWritable: what the log
// holds is in the file first, and what compact writes goes through the
// log, so no later replay puts an older token floor or checkpoint back
// over it. The store is closed when it returns.
func Compact(ctx context.Context, dir string, opts Options, popts participant.Options) (participant.CompactReport, error) {
	st, err := OpenWritable(dir, opts)
	if err != nil {
		return participant.CompactReport{}, err
	}
	rep, err := participant.Compact(ctx, st, popts)
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	return rep, err
}

// backuper is what both engines' stores offer for a consistent copy.
type backuper interface {
	Backup(w io.Writer, begin store.BackupSize) (int64, error)
}

// Backup writes a consistent copy of the store of data directory dir to
// w, one bbolt file that is the whole store (restore it with no log
// beside it), through OpenWritable: the log is replayed into the file
// first, so the copy holds every record the log held, which a copy of the
// file alone would not. begin, if set, learns the size first. The store
// is closed when it returns.
func Backup(dir string, opts Options, w io.Writer, begin store.BackupSize) (int64, error) {
	st, err := OpenWritable(dir, opts)
	if err != nil {
		return 0, err
	}
	b, ok := st.(backuper)
	if !ok {
		st.Close()
		return 0, fmt.Errorf("offline: backup: %T: %w", st, store.ErrUnsupported)
	}
	n, err := b.Backup(w, begin)
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	return n, err
}
