package logfirst

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/vfs"
	"github.com/participantd/participantd/store/wal"
)

// ErrNoSpace reports a disk without the room Open needs: a new log
// segment and the bbolt file's next growth (see StartSpace).
var ErrNoSpace = errors.New("logfirst: not enough disk space to start")

// bbolt grows its file to the next power of two while it is small, then
// by its allocation size (16 MiB) at a time.
const (
	boltMinGrowth = 32 << 10
	boltMaxGrowth = 16 << 20
)

// StartSpace returns the free bytes Open needs in a directory whose bbolt
// file has dbSize bytes, with segments of segmentSize (0: the default):
// the segment Open preallocates for the records to come, and the bbolt
// file's next growth (its size, from 32 KiB up to 16 MiB), which the
// replay or the first checkpoint may take.
func StartSpace(segmentSize, dbSize int64) (segment, bbolt int64) {
	if segmentSize <= 0 {
		segmentSize = wal.DefaultSegmentSize
	}
	return segmentSize, min(max(dbSize, boltMinGrowth), boltMaxGrowth)
}

// checkSpace fails with ErrNoSpace, saying what is needed and what is
// there, when fsys has less room in dir than StartSpace: a start that
// would stop half-way on a full disk is refused before it writes.
func checkSpace(fsys vfs.FS, dir, dbPath string, segmentSize int64) error {
	avail, ok, err := vfs.Available(fsys, dir)
	if err != nil {
		return fmt.Errorf("logfirst: %w", err)
	}
	if !ok {
		return nil
	}
	// bbolt has the file open: a failed stat is a disk's error, not a
	// missing file, and would size the growth of an empty one.
	fi, err := os.Stat(dbPath)
	if err != nil {
		return fmt.Errorf("logfirst: %w", err)
	}
	dbSize := fi.Size()
	seg, growth := StartSpace(segmentSize, dbSize)
	if need := seg + growth; avail < need {
		return fmt.Errorf("%w: %s has %d bytes available and start-up needs %d: %d for a new log segment "+
			"(the segment size) and %d for the growth of %s (%d bytes); free space, or lower the segment size "+
			"(participantd --wal-segment-size)", ErrNoSpace, dir, avail, need, seg, growth, DBFile, dbSize)
	}
	return nil
}

// startLSN reads in tx what a start needs of the bbolt file: whether it
// is laid out, and the checkpoint LSN the log is replayed after. A file
// without a bucket is one bbolt created whose layout the first start
// never committed (a power cut between the two commits): Open lays it
// out, so it is the empty store, at LSN 0. Any other file must have the
// store's layout.
func startLSN(tx *bolt.Tx) (laid bool, ck wal.LSN, err error) {
	if k, _ := tx.Cursor().First(); k == nil {
		return false, 0, nil
	}
	if err := boltfmt.CheckLayout(tx); err != nil {
		return true, 0, err
	}
	ck, err = checkpointLSN(tx)
	return true, ck, err
}

// Started reports whether the log-first engine has started in data
// directory dir, whose log is on fsys (nil: the operating system's): its
// log directory or LogMarkerFile is there. Open and OpenReadOnly read
// such a directory only with its log, and refuse it with ErrLogLost when
// the log is gone. A directory it has not started in is its bbolt file
// alone: a restore, or one only package store (--store bbolt) served.
func Started(dir string, fsys vfs.FS) (bool, error) {
	if fsys == nil {
		fsys = vfs.OS
	}
	marked, err := exists(fsys, filepath.Join(dir, LogMarkerFile))
	if err != nil || marked {
		return marked, err
	}
	_, err = fsys.List(filepath.Join(dir, WALDir))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("logfirst: %w", err)
	}
	return true, nil
}

// exists reports whether fsys has a file at path.
func exists(fsys vfs.FS, path string) (bool, error) {
	f, err := fsys.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("logfirst: %w", err)
	}
	f.Close()
	return true, nil
}

// ErrLogLost reports a data directory whose log was made durable once and
// is now missing or holds no segment: the writes acknowledged after the
// bbolt file's checkpoint were in it. It wraps store.ErrCorrupt.
var ErrLogLost = fmt.Errorf("logfirst: the write-ahead log is lost: %w", store.ErrCorrupt)

// checkLogPresent reports whether dir holds LogMarkerFile, and fails with
// ErrLogLost when it does but the log holds no segment: Open always leaves
// one, so the log was lost (a directory entry a crash dropped, or a
// removal), and with it whatever was acknowledged after checkpoint LSN ck.
func checkLogPresent(fsys vfs.FS, dir string, ck wal.LSN) (bool, error) {
	marker := filepath.Join(dir, LogMarkerFile)
	if marked, err := exists(fsys, marker); err != nil || !marked {
		return false, err
	}
	walDir := filepath.Join(dir, WALDir)
	has, err := wal.HasSegments(walDir, wal.Options{FS: fsys})
	if err != nil {
		return true, fmt.Errorf("logfirst: %w", err)
	}
	if !has {
		return true, fmt.Errorf("%w: %s holds no log segment, though %s says the log was created: "+
			"the writes acknowledged after checkpoint LSN %v of %s are gone; restore the directory from a backup "+
			"(if %s was removed on purpose after a clean stop, which checkpoints every write, remove %s to start a new log)",
			ErrLogLost, walDir, marker, ck, DBFile, walDir, marker)
	}
	return true, nil
}

// markLog writes LogMarkerFile durably, once the log is: the log's
// directory and first segment are in place before the marker says so.
// When the marker is there (marked) its entry may still be one a failed
// directory sync left unwritten (an earlier start failed at this sync,
// and the restart, no reboot between, found it in the page cache), which
// a later sync does not write until the directory changes: so the
// directory is changed (vfs.Dirty) before the sync, which then writes it
// whole. That is one more sync per start.
func markLog(fsys vfs.FS, dir string, marked bool) error {
	path := filepath.Join(dir, LogMarkerFile)
	var err error
	if !marked {
		var f vfs.File
		if f, err = fsys.Create(path); err == nil {
			err = f.Sync()
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	if marked || errors.Is(err, fs.ErrExist) {
		err = vfs.Dirty(fsys, dir)
	}
	if err == nil {
		// The marker's entry: durable, or the check it enables is lost.
		err = fsys.SyncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("logfirst: mark the log created in %s: %w", dir, err)
	}
	return nil
}

// SyncFailedFile is in the data directory, created without a sync, while
// a bbolt commit (a checkpoint, a start's layout or replay) runs and
// after one failed, and after a failed log write: on Linux a failed
// fdatasync marks the unwritten pages clean, the page cache serves them
// to the next process, and no later fdatasync writes them. For a commit
// it is an intent, created before the commit and removed (without a sync)
// once it succeeded, so that a process killed at any instant after a
// failed sync leaves it; a failed log write creates it afterwards (a
// restart writes every record it replays again in any case). The marker
// lives exactly as long as that page cache, unless the kernel writes it
// back (a reboot then costs a needless rewrite). An Open that finds it
// trusts nothing it would read: it writes the whole bbolt file over
// itself and syncs it before bbolt maps it, and removes the marker, with
// a sync of the directory, once the replay is durable.
const SyncFailedFile = "sync.failed"

// markSyncFailed creates SyncFailedFile in dir unless it is there; after
// a failed log write best effort (the store has failed already, and the
// error it returns says why), before a commit required.
func markSyncFailed(fsys vfs.FS, dir string) error {
	f, err := fsys.Create(filepath.Join(dir, SyncFailedFile))
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("logfirst: mark a failed sync in %s: %w", dir, err)
	}
	return f.Close()
}

// rewriteAfterFailedSync writes the bbolt file at path over itself when
// dir holds SyncFailedFile, bbolt's meta pages last (see vfs.Rewrite), and
// reports whether it did.
func rewriteAfterFailedSync(fsys vfs.FS, dir, path string) (bool, error) {
	marked, err := exists(fsys, filepath.Join(dir, SyncFailedFile))
	if err != nil || !marked {
		return false, err
	}
	// Open checked the file (boltfmt.CheckFile) just before.
	m, err := boltfmt.MetaOf(path)
	if errors.Is(err, store.ErrNoData) {
		return true, nil // no file yet: nothing bbolt would read
	}
	if err != nil {
		return true, err
	}
	if err := vfs.Rewrite(fsys, path, 2*int64(m.PageSize)); err != nil {
		return true, fmt.Errorf("logfirst: rewrite %s after a failed sync: %w", path, err)
	}
	return true, nil
}

// clearSyncFailed removes SyncFailedFile from dir durably, once what the
// page cache held is on disk.
func clearSyncFailed(fsys vfs.FS, dir string) error {
	if err := fsys.Remove(filepath.Join(dir, SyncFailedFile)); err != nil {
		return fmt.Errorf("logfirst: %w", err)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("logfirst: sync %s: %w", dir, err)
	}
	return nil
}
