package faultfs

import (
	"bytes"
	"errors"
	iofs "io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
)

// Model is how Crash treats what a file was written since its last Sync.
type Model uint8

const (
	// Strict picks, per file and per Crash, one of TornPrefix and Blocks.
	// It is the default.
	Strict Model = iota
	// TornPrefix loses every unsynced write but the last, which survives
	// up to a random byte.
	TornPrefix
	// Blocks keeps or loses each BlockSize block that changed since the
	// last Sync, independently, at its newest content: a disk that
	// writes a file's dirty sectors back in any order (the ALICE and
	// CrashMonkey model).
	Blocks
)

// BlockSize is the unit the Blocks model keeps or loses whole: a disk
// sector, the most a disk writes atomically.
const BlockSize = 512

// Crash simulates the restart after a power cut (whether or not a rule
// cut it): the namespace goes back to its last synced state, a directory
// whose entry was never synced into its parent is lost with everything
// in it, every file goes back to its synced content, and the cut is
// cleared, so that the same FS serves the restarted process. With rng
// non-nil, what was written since a file's last Sync survives in part, as
// the FS's Model says; with rng nil none of it does. An external file is
// rewritten on the operating system's disk as Crash leaves it, or
// removed if its entry is lost; an error doing so is returned.
func (fs *FS) Crash(rng *rand.Rand) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.replayJournalLocked(rng)
	dirs := map[string]bool{}
	for d := range fs.durableDirs {
		if fs.survivesLocked(d) {
			dirs[d] = true
		}
	}
	names := make(map[string]*file, len(fs.durable))
	for name, f := range fs.durable {
		if !dirs[filepath.Dir(name)] {
			continue
		}
		var data []byte
		if f.external {
			data = crashExternal(f, rng)
		} else {
			data = crashFile(f, rng, fs.model)
		}
		names[name] = &file{data: data, synced: slices.Clone(data), external: f.external}
	}
	var errs []error
	for name, f := range fs.names {
		if f.external && names[name] == nil {
			if err := os.Remove(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	for name, f := range names {
		if f.external {
			if err := os.WriteFile(name, f.data, 0o600); err != nil {
				errs = append(errs, err)
			}
			f.data = nil
		}
	}
	fs.names, fs.durable = names, maps.Clone(names)
	fs.dirs, fs.durableDirs = dirs, maps.Clone(dirs)
	fs.cut, fs.rule = false, nil
	fs.staleDirs = nil
	fs.epoch++
	return errors.Join(errs...)
}

// survivesLocked reports whether directory d and every directory above it
// are durable. fs.mu must be held.
func (fs *FS) survivesLocked(d string) bool {
	for {
		if !fs.durableDirs[d] {
			return false
		}
		parent := filepath.Dir(d)
		if parent == d {
			return true
		}
		d = parent
	}
}

// crashFile returns what a crash leaves of f under model m.
func crashFile(f *file, rng *rand.Rand, m Model) []byte {
	if rng == nil {
		return slices.Clone(f.synced)
	}
	if m == Strict {
		m = TornPrefix + Model(rng.IntN(2))
	}
	if m == Blocks {
		return keepBlocks(f.synced, f.data, rng)
	}
	data := slices.Clone(f.synced)
	if w := f.lastWrite; w != nil {
		n := rng.IntN(len(w.data) + 1)
		if end := w.off + int64(n); end > int64(len(data)) {
			data = append(data, make([]byte, end-int64(len(data)))...)
		}
		copy(data[w.off:], w.data[:n])
	}
	return data
}

// keepBlocks returns old with each BlockSize block in which cur differs
// from it replaced, at random, by cur's. The file keeps old's size unless
// a kept block of cur lies past it.
func keepBlocks(old, cur []byte, rng *rand.Rand) []byte {
	out := slices.Clone(old)
	span := func(b []byte, lo, hi int) []byte { return b[min(lo, len(b)):min(hi, len(b))] }
	for lo := 0; lo < max(len(old), len(cur)); lo += BlockSize {
		hi := lo + BlockSize
		if bytes.Equal(span(old, lo, hi), span(cur, lo, hi)) || rng.IntN(2) == 0 {
			continue
		}
		if end := min(hi, len(cur)); end > len(out) {
			out = append(out, make([]byte, end-len(out))...)
		}
		// A block cur has cut short reads as zeros past cur's end.
		clear(out[lo:min(hi, len(out))])
		copy(out[lo:], span(cur, lo, hi))
	}
	return out
}
