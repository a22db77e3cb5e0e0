package client

import "context"

// OpLocks returns how many participants' op locks the Cluster keeps.
func (c *Cluster) OpLocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.opLocks)
}

// NodeClient returns the Cluster's Client of the node at addr, dialing it
// if needed.
func (c *Cluster) NodeClient(ctx context.Context, addr string) (*Client, error) {
	return c.clientFor(ctx, addr)
}

// Holder returns the node the Cluster records as holding cred's
// participant bound, "" for none.
func (c *Cluster) Holder(cred Credential) string { return c.holder(cred) }
