package faultfs

import (
	"math/rand/v2"
)

// nameChange is a create (f set) or a remove (f nil) of a file name not
// yet made durable by a SyncDir of its directory.
type nameChange struct {
	name string
	f    *file
}

// SetJournaled sets whether a Crash may keep creates and removes of file
// names that no SyncDir made durable, as a journaling file system (ext4,
// XFS) commits them: in the order they were made, any prefix of them,
// since any fsync may commit the journal. A Crash with a nil rng keeps
// none. Off, the default, keeps none either.
func (fs *FS) SetJournaled(on bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.journaled = on
	fs.journal = nil
}

// journalLocked records a create or remove of name. fs.mu must be held.
func (fs *FS) journalLocked(name string, f *file) {
	if fs.journaled {
		fs.journal = append(fs.journal, nameChange{name: name, f: f})
	}
}

// replayJournalLocked applies a random prefix of the journal to the
// durable namespace, and empties it. fs.mu must be held.
func (fs *FS) replayJournalLocked(rng *rand.Rand) {
	if rng != nil && len(fs.journal) > 0 {
		for _, c := range fs.journal[:rng.IntN(len(fs.journal)+1)] {
			if c.f == nil {
				delete(fs.durable, c.name)
			} else {
				fs.durable[c.name] = c.f
			}
		}
	}
	fs.journal = nil
}
