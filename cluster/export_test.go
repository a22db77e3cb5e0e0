package cluster

import "time"

// PauseKeepAlive stops the node from refreshing or checking its lease, and
// makes it believe it still holds it, as a process frozen by a long pause
// would on waking: only etcd's fence can stop its commits then.
func (n *Node) PauseKeepAlive() {
	n.paused.Store(true)
	n.mu.Lock()
	n.deadline = time.Now().Add(time.Hour)
	n.mu.Unlock()
}
