package client

// OpLocks returns how many participants' op locks the Cluster keeps.
func (c *Cluster) OpLocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.opLocks)
}
