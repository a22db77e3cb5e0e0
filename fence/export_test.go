package fence

// SetLeaseWaitHook makes f call hook each time LeaseSettled (and so Accept)
// is about to block on token's pending lease, so a test can prove a waiter
// is inside the wait without sleeping. Call it before f is shared.
func SetLeaseWaitHook[K comparable](f *Fences[K], hook func(Token)) {
	f.leaseWaitHook = hook
}

// Outstanding returns how many tokens site's current generation holds, or
// -1 when site has none.
func Outstanding[K comparable](f *Fences[K], site K) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	gen, ok := f.current[site]
	if !ok {
		return -1
	}
	return len(gen.outstanding)
}
