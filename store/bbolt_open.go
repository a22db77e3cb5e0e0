package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Open opens or creates the bbolt data file at path. If another process or
// another Open in this process holds the file, Open fails after
// opts.LockTimeout with an error that names path and wraps ErrLocked.
//
// Before bbolt maps an existing file, Open checks its size and meta pages
// (see checkFile); a damaged file fails with an error naming path and
// wrapping ErrCorrupt, as does a panic or memory fault of bbolt while it
// opens the file. A missing or 0-byte file fails with ErrNoData when
// opts.ReadOnly or opts.MustExist is set, and is otherwise created (and its
// directory fsync'd, so that the file survives a crash).
func Open(path string, opts Options) (*Bolt, error) {
	return open(path, opts, hooks{})
}

// CheckFile runs the checks a read-write Open runs on the file at path
// before bbolt maps it, without opening it, for another writer of the same
// file (the log-first store, which checkpoints into it): a damaged file is
// an error naming path and wrapping ErrCorrupt, a file another process is
// writing ErrLocked, and a missing or 0-byte one ErrNoData when mustExist
// is set (else nil: the caller creates it). Like Open, it reads every page
// of a file without a persisted freelist (bbolt would walk them all
// itself) and only the page structure above the leaves of one with (see
// doc.go, Opening a file).
func CheckFile(path string, mustExist bool) error {
	return checkFileFor(path, mustExist, false)
}

// CheckFileWhole is CheckFile reading every page whatever the file, for
// a read-only open: offline tools, which should see damage before they
// report on the file.
func CheckFileWhole(path string, mustExist bool) error {
	return checkFileFor(path, mustExist, true)
}

func checkFileFor(path string, mustExist, whole bool) error {
	state, meta, err := checkFile(path)
	if err != nil {
		return fmt.Errorf("store: open: %w", err)
	}
	if state == fileValid {
		mode := walkModeFor(meta)
		if whole {
			mode = walkAll
		}
		if err := walkFile(path, meta, mode); err != nil {
			if lockedByWriter(path) {
				return fmt.Errorf("open %s: %w", path, ErrLocked)
			}
			return fmt.Errorf("store: open: %s: %w: %w", path, err, ErrCorrupt)
		}
		return nil
	}
	if mustExist {
		what := "does not exist"
		if state == fileEmpty {
			what = "is empty (0 bytes)"
		}
		return fmt.Errorf("store: open %s: the file %s: %w", path, what, ErrNoData)
	}
	return nil
}

func open(path string, opts Options, h hooks) (*Bolt, error) {
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	state, meta, err := checkFile(path)
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", err)
	}
	if state == fileValid && !opts.ReadOnly {
		// bbolt walks every page when it opens a file without a persisted
		// freelist for writing, in a goroutine where damage cannot be
		// contained: walk it first. With one, bbolt reads the freelist and
		// the pages a transaction touches: check the freelist and the
		// structure above the leaves.
		if err := walkFile(path, meta, walkModeFor(meta)); err != nil {
			if lockedByWriter(path) {
				// A writer holds the file: what was read may be a commit
				// in progress, not damage.
				return nil, fmt.Errorf("open %s: %w", path, ErrLocked)
			}
			return nil, fmt.Errorf("store: open: %s: %w: %w", path, err, ErrCorrupt)
		}
	}
	if state != fileValid && (opts.ReadOnly || opts.MustExist) {
		what := "does not exist"
		if state == fileEmpty {
			what = "is empty (0 bytes)"
		}
		return nil, fmt.Errorf("store: open %s: the file %s: %w", path, what, ErrNoData)
	}
	var db *bolt.DB
	err = contain(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout:        timeout,
			ReadOnly:       opts.ReadOnly,
			FreelistType:   bolt.FreelistMapType,
			NoFreelistSync: !opts.PersistFreelist,
		})
		return err
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open %s: waited %v: %w", path, timeout, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if opts.ReadOnly {
		// The shared lock now keeps writers out, so the file is at rest:
		// check its pages before anything reads them.
		if err := checkAtRest(path); err != nil {
			db.Close()
			return nil, fmt.Errorf("store: open: %w", err)
		}
	}
	layout := initLayout
	if opts.ReadOnly {
		layout = checkLayout
	}
	if err := contain(path, func() error {
		if opts.ReadOnly {
			return db.View(layout)
		}
		return db.Update(layout)
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if state != fileValid && !opts.ReadOnly {
		// bbolt fsync'd the new file's pages, not its directory entry:
		// without this, a crash could lose the whole file after commits to
		// it were acknowledged.
		sync := syncDir
		if h.syncDir != nil {
			sync = h.syncDir
		}
		if err := sync(filepath.Dir(path)); err != nil {
			db.Close()
			return nil, fmt.Errorf("store: open %s: sync directory: %w", path, err)
		}
	}
	b := &Bolt{
		path:     path,
		db:       db,
		hooks:    h,
		readOnly: opts.ReadOnly,
		kick:     make(chan struct{}, 1),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		streams:  make(map[string]*boltStream),
		dirty:    make(map[string]*boltStream),
		values:   make(map[string]uint64),
		staged:   make(map[string]uint64),
	}
	go b.run()
	return b, nil
}

// contain runs fn, which calls into bbolt, and turns a panic or a memory
// fault during it into an error naming path and wrapping ErrCorrupt. bbolt
// reads pages through a mapping of the file and panics on a page it
// cannot parse (or faults on one the file does not hold): that is damaged
// input, not a broken invariant of this program, and the caller gets to
// say so instead of crashing. Only bbolt calls and the read callbacks of
// this package run inside it.
func contain(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: bbolt failed reading it: %v: %w", path, r, ErrCorrupt)
		}
	}()
	return fn()
}

// view runs fn in a bbolt read transaction, with panics and faults
// contained (see contain).
func (b *Bolt) view(fn func(*bolt.Tx) error) error {
	return contain(b.path, func() error { return b.db.View(fn) })
}

// initLayout creates the buckets of a new file and checks the layout
// version of an existing one.
func initLayout(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if tx.Bucket(bucketStreams) != nil || tx.Bucket(bucketValues) != nil {
			return errors.New("data file has buckets but no layout version")
		}
		var err error
		if meta, err = tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		if err := meta.Put(keyVersion, []byte{layoutVersion}); err != nil {
			return err
		}
	}
	if v := meta.Get(keyVersion); len(v) != 1 || v[0] != layoutVersion {
		return fmt.Errorf("unsupported layout version %v", v)
	}
	for _, name := range [][]byte{bucketStreams, bucketValues} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return nil
}

// checkLayout checks, without writing, that the file has this package's
// layout; a read-only open cannot create it.
func checkLayout(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return errors.New("not a participantd store: no meta bucket")
	}
	if v := meta.Get(keyVersion); len(v) != 1 || v[0] != layoutVersion {
		return fmt.Errorf("unsupported layout version %v", v)
	}
	for _, name := range [][]byte{bucketStreams, bucketValues} {
		if tx.Bucket(name) == nil {
			return fmt.Errorf("not a participantd store: no %s bucket", name)
		}
	}
	return nil
}
