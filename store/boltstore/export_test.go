package boltstore

import (
	"os"

	"github.com/participantd/participantd/store/boltfmt"
)

// TestHooks exposes the committer's hooks to the external test package.
type TestHooks struct {
	BeforeCommit func()
	CommitErr    func() error
	FlushWaiting func()
	CASLoaded    func(key string)
	SyncDir      func(dir string) error
}

// OpenWithHooks is Open with test hooks installed.
func OpenWithHooks(path string, opts Options, h TestHooks) (*Store, error) {
	return open(path, opts, hooks{
		beforeCommit: h.BeforeCommit,
		commitErr:    h.CommitErr,
		flushWaiting: h.FlushWaiting,
		casLoaded:    h.CASLoaded,
		syncDir:      h.SyncDir,
	})
}

// CachedValues is how many keys the value cache holds.
func (b *Store) CachedValues() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.vals.LenLocked()
}

// ReadMetaPage returns the page size and high water mark of the meta page
// bbolt would use, for tests that damage a file precisely.
func ReadMetaPage(path string) (pageSize int64, hwm uint64, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	m0, err0 := boltfmt.ParseMeta(raw)
	if err0 != nil {
		return 0, 0, err0
	}
	m := m0
	if m1, err := boltfmt.ParseMeta(raw[m0.PageSize:]); err == nil && m1.TxID > m0.TxID {
		m = m1
	}
	return int64(m.PageSize), m.HighWater, nil
}

// CachedStreams is how many streams have a state in memory.
func (b *Store) CachedStreams() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.streams.CountLocked()
}
