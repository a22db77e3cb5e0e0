package store

// TestHooks exposes the committer's hooks to the external test package.
type TestHooks struct {
	BeforeCommit func()
	CommitErr    func() error
	FlushWaiting func()
	CASLoaded    func(key string)
}

// OpenWithHooks is Open with test hooks installed.
func OpenWithHooks(path string, opts Options, h TestHooks) (*Bolt, error) {
	return open(path, opts, hooks{
		beforeCommit: h.BeforeCommit,
		commitErr:    h.CommitErr,
		flushWaiting: h.FlushWaiting,
		casLoaded:    h.CASLoaded,
	})
}

// CachedValues is how many keys the value cache holds.
func (b *Bolt) CachedValues() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.values)
}
