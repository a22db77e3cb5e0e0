//go:build !linux

package vfs

import (
	"fmt"
)

// Sync uses the platform's fsync (on darwin, os.File.Sync issues
// F_FULLFSYNC, the only call that reaches the platter there); Linux uses
// fdatasync (vfs_linux.go).
func (f osFile) Sync() error {
	return f.File.Sync()
}

// Preallocate grows the file with Truncate: the platforms other than Linux
// have no portable fallocate. The blocks are then allocated as the log
// writes them, so a full disk shows at a write instead of at rotation.
func (f osFile) Preallocate(size int64) error {
	if err := f.File.Truncate(size); err != nil {
		return fmt.Errorf("preallocate %s: %w", f.Name(), err)
	}
	return nil
}
