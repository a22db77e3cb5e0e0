package faultfs

import (
	"errors"
	iofs "io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
)

// crashExternal returns what a crash leaves of an external file: its
// content after the last Commit, or, when the power was cut during one,
// that commit torn as a crash tears a bbolt commit: bbolt writes the data
// pages, syncs, writes the meta page, syncs. Pages 0 and 1 are its meta
// pages (page size 4096).
func crashExternal(f *file, rng *rand.Rand) []byte {
	if f.pending == nil || rng == nil {
		return slices.Clone(f.synced)
	}
	const metaEnd = 2 * 4096
	old, cur := f.synced, f.pending
	split := func(b []byte) ([]byte, []byte) {
		if len(b) <= metaEnd {
			return b, nil
		}
		return b[:metaEnd], b[metaEnd:]
	}
	oldMeta, oldData := split(old)
	curMeta, curData := split(cur)
	var meta, data []byte
	if rng.IntN(2) == 0 {
		// Cut before the first sync: the data pages in any state, the meta
		// pages as they were. bbolt grows a file (truncate, fsync) before
		// it writes pages there, so the size is the new one.
		meta, data = slices.Clone(oldMeta), keepBlocks(oldData, curData, rng)
		if len(data) < len(curData) {
			data = append(data, make([]byte, len(curData)-len(data))...)
		}
	} else {
		// Cut before the second: the data pages written, the meta page
		// torn, at a random byte or sector by sector.
		data = slices.Clone(curData)
		meta = crashFile(&file{synced: oldMeta, data: curMeta, lastWrite: metaWrite(oldMeta, curMeta)}, rng, Strict)
	}
	if len(meta) < metaEnd && len(data) > 0 {
		meta = append(meta, make([]byte, metaEnd-len(meta))...)
	}
	return append(meta, data...)
}

// metaWrite is the write that turned old into cur: the span of the bytes
// that differ.
func metaWrite(old, cur []byte) *torn {
	lo, hi := -1, 0
	for i := range cur {
		if i >= len(old) || old[i] != cur[i] {
			if lo < 0 {
				lo = i
			}
			hi = i + 1
		}
	}
	if lo < 0 {
		return nil
	}
	return &torn{off: int64(lo), data: slices.Clone(cur[lo:hi])}
}

// Commit implements vfs.Committer: it counts an OpCommit of path and runs
// write, which changes the operating system's file at path and makes the
// change durable. A rule's Fail or Cut there returns an error without
// running write, except that a Cut runs it first, so that Crash can tear
// the commit it interrupted. A FailSync runs write and fails its sync the
// Linux way: the pages it changed stay in the file, which the next
// process reads, but not on disk, and a later Commit writes only those it
// changes again (see doc.go, Failed syncs). The file's directory entry
// becomes durable with a SyncDir of its directory, as a created file's
// does.
func (fs *FS) Commit(path string, write func() error) error {
	path = clean(path)
	fs.mu.Lock()
	act, wasCut, err := fs.decideCommitLocked(path)
	if err == nil && !fs.dirs[filepath.Dir(path)] {
		err, act = &OpError{Op: Op{Kind: OpCommit, Path: path}, Err: ErrNotExist}, None
	}
	// The file before write, to tell which pages write changed, when
	// that matters: a failed sync, or stale pages a commit may rewrite.
	needBefore := act == FailSync || (fs.names[path] != nil && len(fs.names[path].stale) > 0)
	fs.mu.Unlock()
	if err != nil && !wasCut && act != FailSync {
		return err
	}
	var before []byte
	if needBefore {
		var rerr error
		if before, rerr = os.ReadFile(path); rerr != nil && !errors.Is(rerr, iofs.ErrNotExist) {
			return rerr
		}
	}
	// write runs without the lock: it is another library's I/O.
	werr := write()
	content, rerr := os.ReadFile(path)
	if errors.Is(rerr, iofs.ErrNotExist) {
		rerr = nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.names[path]
	if f == nil && (rerr != nil || content != nil) {
		f = &file{external: true}
		fs.names[path] = f
	}
	switch {
	case f == nil || rerr != nil:
	case wasCut:
		f.pending = content
	case act == FailSync:
		f.markStale(before, content) // the disk keeps f.synced
	case werr == nil:
		f.commitSynced(before, content)
	}
	if werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	return rerr
}

// Rewrite implements vfs.Rewriter: it counts an OpCommit of path and runs
// write, which writes every page of the operating system's file at path
// over itself and syncs: every page, stale ones included, is then on
// disk as the file holds it. Rules act on it as on a Commit (a Cut tears
// it as a bbolt commit: write syncs the pages past the head first).
func (fs *FS) Rewrite(path string, write func() error) error {
	path = clean(path)
	fs.mu.Lock()
	act, wasCut, err := fs.decideCommitLocked(path)
	fs.mu.Unlock()
	if err != nil && !wasCut && act != FailSync {
		return err
	}
	werr := write()
	content, rerr := os.ReadFile(path)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.names[path]
	switch {
	case f == nil || rerr != nil || werr != nil || act == FailSync:
		// A failed rewrite leaves every page as it was: stale ones stay.
	case wasCut:
		f.pending = content
	default:
		f.stale = nil
		f.synced = content
	}
	for _, e := range []error{werr, err, rerr} {
		if e != nil {
			return e
		}
	}
	return nil
}

// decideCommitLocked counts an OpCommit of path and returns the rule's
// action, whether it cut the power at this very op (the commit then runs,
// for Crash to tear it), and the error the op fails with. fs.mu must be
// held.
func (fs *FS) decideCommitLocked(path string) (act Action, wasCut bool, err error) {
	act, err = fs.decideLocked(OpCommit, path)
	wasCut = fs.cut && fs.cutOp.Kind == OpCommit && fs.cutOp.Path == path && fs.cutOp.Index == fs.ops-1
	return act, wasCut, err
}
