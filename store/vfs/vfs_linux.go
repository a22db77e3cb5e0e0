//go:build linux

package vfs

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Sync uses fdatasync: the log never needs the file's times, only its data
// and size, which fdatasync covers.
func (f osFile) Sync() error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
			}
			return nil
		}
	}
}

// Preallocate uses fallocate, which reserves the blocks without writing
// them; on a file system without it, it grows the file with Truncate.
func (f osFile) Preallocate(size int64) error {
	for {
		err := unix.Fallocate(int(f.Fd()), 0, 0, size)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
			if err := f.File.Truncate(size); err != nil {
				return fmt.Errorf("preallocate %s: %w", f.Name(), err)
			}
			return nil
		default:
			return &os.PathError{Op: "fallocate", Path: f.Name(), Err: err}
		}
	}
}
