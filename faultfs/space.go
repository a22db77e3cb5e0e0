package faultfs

import (
	"math"
)

// SetCapacity bounds the bytes all files together may hold (an external
// file counts at its size after its last Commit); 0 removes the bound. A
// WriteAt, Preallocate or Truncate that would pass it fails with
// ErrNoSpace and changes nothing, as a full disk refuses.
func (fs *FS) SetCapacity(n int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.capacity = n
}

// Available implements vfs.Spacer: the capacity left, or the most an
// int64 holds when there is no bound.
func (fs *FS) Available(string) (int64, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.capacity == 0 {
		return math.MaxInt64, nil
	}
	return max(fs.capacity-fs.usedLocked(), 0), nil
}

// usedLocked returns the bytes the files hold. fs.mu must be held.
func (fs *FS) usedLocked() int64 {
	var n int64
	for _, f := range fs.names {
		if f.external {
			n += int64(len(f.synced))
		} else {
			n += int64(len(f.data))
		}
	}
	return n
}

// growLocked fails with ErrNoSpace when f growing to size would pass the
// capacity. fs.mu must be held.
func (fs *FS) growLocked(f *file, kind OpKind, name string, size int64) error {
	if grow := size - int64(len(f.data)); fs.capacity > 0 && grow > 0 && fs.usedLocked()+grow > fs.capacity {
		return &OpError{Op: Op{Index: fs.ops - 1, Kind: kind, Path: name}, Err: ErrNoSpace}
	}
	return nil
}
