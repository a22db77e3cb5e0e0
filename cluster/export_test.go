package cluster

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// PauseKeepAlive stops the node from refreshing or checking its lease, and
// makes it believe it still holds it, as a process frozen by a long pause
// would on waking: only etcd's fence can stop its commits then.
func (n *Node) PauseKeepAlive() {
	n.paused.Store(true)
	n.mu.Lock()
	n.deadline = n.now().add(time.Hour)
	n.mu.Unlock()
}

// LoseLease makes the node lose its lease as a lapsed one is lost (every
// owned conversation dropped and forgotten, the lease revoked) and take a
// new one, as its keep-alive would on its next tick.
func (n *Node) LoseLease(ctx context.Context) error {
	n.paused.Store(true)
	defer n.paused.Store(false)
	n.loseLease(n.currentLease(), errors.New("cluster: lease lost in a test"))
	return n.acquireLease(ctx)
}

// StopKeepAlive stops the node from refreshing or checking its lease,
// leaving its deadline as it is: a keep-alive that has not ticked yet.
func (n *Node) StopKeepAlive() { n.paused.Store(true) }

// CurrentLease returns the lease the node holds, 0 while it holds none.
func (n *Node) CurrentLease() clientv3.LeaseID { return n.currentLease() }
