package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/participant"
)

// Owner is the node that owns a conversation, as its ownership key says.
type Owner struct {
	// Node is the owner's node id; empty when no node owns the
	// conversation now (nobody touched it since its owner's lease ended).
	Node string
	// Addr is its advertised wire address, the owner a moved answer names.
	Addr string
	// Health is the URL of its health listener, empty when it advertises
	// none.
	Health string
	// Self reports that the key is this node's own claim, under its
	// current lease.
	Self bool
}

// Owner reads who owns conversation c, without claiming it: one read of
// own/<c>, whatever this node believes. An ownership record it cannot
// read (a newer version's) is an error.
func (n *Node) Owner(ctx context.Context, c participant.ConversationID) (Owner, error) {
	cctx, cancel := n.ctx(ctx)
	defer cancel()
	resp, err := n.cli.Get(cctx, n.ownKey(c))
	if err != nil {
		return Owner{}, fmt.Errorf("cluster: owner of %v: %w", c, err)
	}
	if len(resp.Kvs) == 0 {
		return Owner{}, nil
	}
	kv := resp.Kvs[0]
	var r record
	body, err := n.unseal(n.ownKey(c), kv.Value)
	if err != nil {
		return Owner{}, fmt.Errorf("cluster: owner of %v: %w", c, err)
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Node == "" {
		return Owner{}, fmt.Errorf("cluster: owner of %v: unreadable ownership record %q", c, kv.Value)
	}
	lease := n.currentLease()
	return Owner{Node: r.Node, Addr: r.Addr, Health: r.Health,
		Self: lease != 0 && clientv3.LeaseID(kv.Lease) == lease}, nil
}

// Self is this node as the owner of what it claims: its id, advertised
// wire address and health URL.
func (n *Node) Self() Owner {
	return Owner{Node: n.opts.NodeID, Addr: n.opts.Advertise, Health: n.opts.AdvertiseHealth, Self: true}
}
