package boltstore

import (
	"errors"
	"fmt"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/internal/stage"
)

// Open opens or creates the bbolt data file at path. If another process or
// another Open in this process holds the file, Open fails after
// opts.LockTimeout with an error that names path and wraps store.ErrLocked.
//
// Before bbolt maps an existing file, Open checks its size and meta pages
// (see boltfmt.CheckFile); a damaged file fails with an error naming path and
// wrapping store.ErrCorrupt, as does a panic or memory fault of bbolt while it
// opens the file. A missing or 0-byte file fails with store.ErrNoData when
// opts.ReadOnly or opts.MustExist is set, and is otherwise created (and its
// directory fsync'd, so that the file survives a crash).
func Open(path string, opts Options) (*Store, error) {
	return open(path, opts, hooks{})
}

func open(path string, opts Options, h hooks) (*Store, error) {
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	// bbolt walks every page when it opens a file without a persisted
	// freelist for writing, in a goroutine where damage cannot be
	// contained: walk it first. With one, bbolt reads the freelist and the
	// pages a transaction touches: check the freelist and the structure
	// above the leaves. A read-only open walks the file once it holds the
	// shared lock (below).
	walk := boltfmt.WalkAsNeeded
	if opts.ReadOnly {
		walk = boltfmt.WalkNone
	}
	exists, err := boltfmt.CheckFileWalk(path, opts.ReadOnly || opts.MustExist, walk)
	if err != nil {
		return nil, err
	}
	var db *bolt.DB
	err = boltfmt.Contain(path, func() error {
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
		return nil, fmt.Errorf("open %s: waited %v: %w", path, timeout, store.ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if opts.ReadOnly {
		// The shared lock now keeps writers out, so the file is at rest:
		// check its pages before anything reads them.
		if err := boltfmt.CheckAtRest(path); err != nil {
			db.Close()
			return nil, fmt.Errorf("store: open: %w", err)
		}
	}
	if opts.ReadOnly {
		err = boltfmt.Contain(path, func() error { return db.View(boltfmt.CheckLayout) })
	} else {
		err = boltfmt.Lay(func(fn func(*bolt.Tx) error) error {
			return boltfmt.Contain(path, func() error { return db.Update(fn) })
		})
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if !exists && !opts.ReadOnly {
		// bbolt fsync'd the new file's pages, not its directory entry:
		// without this, a crash could lose the whole file after commits to
		// it were acknowledged.
		sync := boltfmt.SyncDir
		if h.syncDir != nil {
			sync = h.syncDir
		}
		if err := sync(filepath.Dir(path)); err != nil {
			db.Close()
			return nil, fmt.Errorf("store: open %s: sync directory: %w", path, err)
		}
	}
	b := &Store{
		path:     path,
		db:       db,
		hooks:    h,
		readOnly: opts.ReadOnly,
		group:    stage.NewGroup(),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		streams:  stage.NewStreams[*boltStream](),
		vals:     stage.NewValues(stage.ForgetAtLanding),
	}
	go b.run()
	return b, nil
}

// view runs fn in a bbolt read transaction, with panics and faults
// contained (see contain).
func (b *Store) view(fn func(*bolt.Tx) error) error {
	return boltfmt.Contain(b.path, func() error { return b.db.View(fn) })
}
