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

// markStale records a sync that failed the Linux way: the pages dirtied
// since the file held old (the disk's content, for a Sync; the file
// before the write, for a Commit), those where cur differs from old
// (zeros past either's end), are marked clean without being written, and
// the page cache keeps serving them.
func (f *file) markStale(old, cur []byte) {
	for pg := int64(0); pg*PageSize < max(int64(len(old)), int64(len(cur))); pg++ {
		if !bytes.Equal(page(cur, pg), page(old, pg)) {
			if f.stale == nil {
				f.stale = map[int64]struct{}{}
			}
			f.stale[pg] = struct{}{}
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
