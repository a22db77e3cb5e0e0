// Package vfs is the narrow file-system interface the write-ahead log
// writes through, so that tests can put a fault-injecting file system
// (package faultfs) under it. OS is the real one.
//
// # Durability
//
//	call                 durable when it returns nil
//	File.WriteAt         nothing
//	File.Sync            the file's data and size (fdatasync)
//	File.Preallocate     nothing until the next Sync
//	File.Truncate        nothing until the next Sync
//	FS.Create, Remove,   nothing until SyncDir of the parent directory
//	  MkdirAll
//	FS.SyncDir           every create and remove in the directory
//	MkdirAll (func)      the directory and every one it created, at once
//	Commit (func)        what write made durable
//	Rewrite (func)       the file as the process reads it
//	Dirty (func)         nothing until SyncDir; that one then writes the
//	                       directory whole
//
// A failed Sync leaves the file's durable contents unknown; callers treat
// it as fatal. So does a failed SyncDir: on Linux the directory's changes
// may then be marked clean without being written, and a later SyncDir
// succeeds without writing them until the directory changes again (Dirty).
package vfs

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// File is an open file.
type File interface {
	io.ReaderAt
	// WriteAt writes p at off (pwrite).
	WriteAt(p []byte, off int64) (int, error)
	// Sync makes the file's data and size durable (fdatasync).
	Sync() error
	// Preallocate reserves size bytes, growing the file to size with
	// zeros.
	Preallocate(size int64) error
	// Truncate sets the file's size.
	Truncate(size int64) error
	// Size returns the file's current size.
	Size() (int64, error)
	Close() error
}

// FS is a file system.
type FS interface {
	// Create creates name for reading and writing; it fails if name
	// exists.
	Create(name string) (File, error)
	// Open opens name read-only.
	Open(name string) (File, error)
	// OpenRW opens an existing name for reading and writing.
	OpenRW(name string) (File, error)
	// Remove removes name.
	Remove(name string) error
	// List returns the names of the entries of dir, sorted.
	List(dir string) ([]string, error)
	// MkdirAll creates dir and its parents.
	MkdirAll(dir string) error
	// SyncDir makes the creates and removes in dir durable.
	SyncDir(dir string) error
}

// Committer is implemented by a file system that models crashes
// (faultfs) and must see the writes another library makes to a file
// through the operating system, bbolt's data file, as one operation each.
type Committer interface {
	// Commit runs write, which changes the operating system's file at
	// path and makes the change durable before it returns nil (a bbolt
	// transaction). An injected fault fails Commit, with write run or
	// not. The file's directory entry is durable only after SyncDir of its
	// directory, as a created file's.
	Commit(path string, write func() error) error
}

// Commit runs write, a durable change to the operating system's file at
// path made by another library, through fs when fs is a Committer.
func Commit(fs FS, path string, write func() error) error {
	if c, ok := fs.(Committer); ok {
		return c.Commit(path, write)
	}
	return write()
}

// Rewriter is implemented by a file system that models the page cache
// (faultfs) and must see Rewrite of the operating system's file at path as
// one operation that writes every page of it.
type Rewriter interface {
	// Rewrite runs write, which writes every page of the file at path
	// over itself and syncs, and returns its error.
	Rewrite(path string, write func() error) error
}

// Rewrite writes every byte of the operating system's file at path over
// itself and syncs it, the bytes from head on first and the first head
// bytes after a sync: after a failed sync Linux marks the unwritten pages
// clean and the page cache keeps serving them, so only writing them again
// makes what a reader sees durable. Writing the head last keeps a crash
// during Rewrite from leaving a head (bbolt's meta pages) that points at
// pages not yet written. It goes through fs when fs is a Rewriter.
func Rewrite(fs FS, path string, head int64) error {
	write := func() error { return rewriteFile(path, head) }
	if r, ok := fs.(Rewriter); ok {
		return r.Rewrite(path, write)
	}
	return write()
}

func rewriteFile(path string, head int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	head = min(max(head, 0), size)
	buf := make([]byte, 1<<20)
	span := func(lo, hi int64) error {
		for off := lo; off < hi; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hi-off)], off)
			if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
				return fmt.Errorf("rewrite %s: %w", path, err)
			}
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return fmt.Errorf("rewrite %s: %w", path, err)
			}
			off += int64(n)
		}
		if err := (osFile{f}).Sync(); err != nil {
			return fmt.Errorf("rewrite %s: %w", path, err)
		}
		return nil
	}
	if err := span(head, size); err != nil {
		return err
	}
	return span(0, head)
}

// MkdirAll creates dir and its missing parents on fs, and makes each new
// entry durable before it returns nil, by syncing the directory that
// holds it: a directory whose entry a crash can lose takes every file
// in it along, however well those were synced.
func MkdirAll(fs FS, dir string) error {
	dir = filepath.Clean(dir)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := fs.List(d); err == nil {
			break
		} else if !errors.Is(err, iofs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := fs.MkdirAll(dir); err != nil {
		return err
	}
	// The top one first: its parent's sync makes it durable, then each
	// new directory's sync makes the next.
	for i := len(missing) - 1; i >= 0; i-- {
		if err := fs.SyncDir(filepath.Dir(missing[i])); err != nil {
			return fmt.Errorf("sync %s: %w", filepath.Dir(missing[i]), err)
		}
	}
	return nil
}

// DirtyName is the scratch entry Dirty creates and removes.
const DirtyName = "dirty.tmp"

// Dirty changes directory dir (a scratch entry, DirtyName, created and
// removed) so that the next SyncDir of it writes it whole: entries a
// failed directory sync left marked clean but unwritten (Linux, as for a
// file's pages) are written with it. A scratch entry a crash left is
// removed, which is the change. Nothing is durable until that SyncDir.
func Dirty(fs FS, dir string) error {
	path := filepath.Join(dir, DirtyName)
	f, err := fs.Create(path)
	if err != nil && !errors.Is(err, iofs.ErrExist) {
		return fmt.Errorf("dirty %s: %w", dir, err)
	}
	if err == nil {
		if err := f.Close(); err != nil {
			return fmt.Errorf("dirty %s: %w", dir, err)
		}
	}
	if err := fs.Remove(path); err != nil {
		return fmt.Errorf("dirty %s: %w", dir, err)
	}
	return nil
}

// Spacer is implemented by a file system that can say how much space is
// left: OS, and faultfs with a capacity.
type Spacer interface {
	// Available returns the bytes that files in dir can still grow by.
	Available(dir string) (int64, error)
}

// Available returns the bytes left for files in dir on fs, and false when
// fs cannot say.
func Available(fs FS, dir string) (int64, bool, error) {
	s, ok := fs.(Spacer)
	if !ok {
		return 0, false, nil
	}
	n, err := s.Available(dir)
	return n, err == nil, err
}

// OS is the operating system's file system.
var OS FS = osFS{}

// Available implements Spacer with statfs: the blocks available to an
// unprivileged user.
func (osFS) Available(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

type osFS struct{}

type osFile struct{ *os.File }

func (osFS) Create(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Open(name string) (File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) OpenRW(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Remove(name string) error { return os.Remove(name) }

func (osFS) List(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	sort.Strings(names)
	return names, nil
}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o700) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (f osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
