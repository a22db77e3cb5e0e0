package faultfs

import (
	"bytes"
	"slices"
)

// PageSize is the unit of the page cache: what a failed sync marks clean
// and a later write dirties again, whole.
const PageSize = 4096

// page returns b's bytes of page pg, zero-filled past b's end.
func page(b []byte, pg int64) []byte {
	out := make([]byte, PageSize)
	if lo := pg * PageSize; lo < int64(len(b)) {
		copy(out, b[lo:])
	}
	return out
}

// markStale is what a failed fdatasync does to a file in memory on
// Linux: every dirty page, one whose content differs from the disk's, is
// marked clean without being written. The page cache keeps serving it.
func (f *file) markStale() {
	for pg := int64(0); pg*PageSize < max(int64(len(f.data)), int64(len(f.synced))); pg++ {
		if !bytes.Equal(page(f.data, pg), page(f.synced, pg)) {
			if f.stale == nil {
				f.stale = map[int64][]byte{}
			}
			f.stale[pg] = nil
		}
	}
}

// writeBack returns what the disk holds once a sync of a file whose page
// cache holds cur succeeds: cur, at cur's size, but for the stale pages,
// which keep the disk's content (f.synced's, zeros past its end).
func (f *file) writeBack(cur []byte) []byte {
	out := slices.Clone(cur)
	for pg := range f.stale {
		lo := pg * PageSize
		if lo >= int64(len(out)) {
			continue
		}
		copy(out[lo:min(lo+PageSize, int64(len(out)))], page(f.synced, pg))
	}
	return out
}

// commitFailedSync records a Commit whose sync failed the Linux way: the
// pages write changed between before and cur (the operating system's file
// before and after it) are stale, their content kept for reads only; the
// disk keeps f.synced.
func (f *file) commitFailedSync(before, cur []byte) {
	for pg := int64(0); pg*PageSize < max(int64(len(before)), int64(len(cur))); pg++ {
		if p := page(cur, pg); !bytes.Equal(p, page(before, pg)) {
			if f.stale == nil {
				f.stale = map[int64][]byte{}
			}
			f.stale[pg] = p
		}
	}
}

// commitSynced records a Commit that succeeded: the disk holds cur but
// for the stale pages write did not change (cur's equals before's there),
// which keep the disk's content. A stale page write changed is written
// whole, and no longer stale.
func (f *file) commitSynced(before, cur []byte) {
	for pg := range f.stale {
		if !bytes.Equal(page(cur, pg), page(before, pg)) || pg*PageSize >= int64(len(cur)) {
			delete(f.stale, pg)
		}
	}
	f.synced = f.writeBack(cur)
}
