// Package cluster is participantd's cluster mode: a Node joins an etcd
// cluster, holds a lease, claims conversations on first touch and fences
// every commit of a conversation with its claim, so that a node that lost a
// conversation (its lease expired while it was paused or partitioned) is
// refused by etcd itself, never by timing alone. A Node is the
// participant.Ownership of its service; package participant has no cluster
// branches.
//
// # Keys
//
// Under Options.Prefix: node/<id> (the live-node record, under the node's
// lease), ordinal/<id> and ordinals, own/<conversation> (a claim, under
// the owner's lease), secret/node-key, restoring, format (the cluster
// format, written with a new cluster), converting (while Convert runs),
// and the data under d/ (package etcdstore). Every value is sealed with a
// checksum of its key and body (format.go, SealRel) and checked when read;
// a prefix without a format key is refused until converted. The table of every stored key, with its value and
// owner, is in docs/DESIGN.md, "Stored keys"; it is the one home of the
// layout.
//
// node/<id> and own/<conversation> live under a lease: they are claims, not
// data (Ephemeral), and backups (package backup) leave them out. "addr" is
// the wire address a moved answer names, "health" the URL of the node's
// health listener (omitted when not advertised), where Owner sends an
// operator. View reads a whole data set read-only, for the offline tools.
//
// # Invariants
//
//   - A node serves (decides, replays, commits, pushes) a conversation only
//     while it holds its claim under a live lease: Acquire grants nothing
//     else, and every commit compares the claim key's mod revision (its
//     create revision until the store settles the scope, see etcdstore),
//     so a commit after the claim is gone is refused by etcd and writes
//     nothing. Pushes stop at the lease's local deadline (Holds), by the
//     monotonic and the boot clock, before etcd can expire the lease.
//   - A claim is fresh: the store forgets what it cached of the
//     conversation and the service reconciles it from etcd, ending the
//     previous owner's bindings as died/unclean_restart.
//   - A lost lease (unknown to etcd, or past its local deadline) drops
//     every owned conversation at once; the node takes a new lease and
//     claims again on the next touch.
//   - A conversation's failed scope (fenced off, unknown outcome, conflict)
//     fails that conversation only: the service sees a *ConversationError,
//     never store.ErrFailed, and the next Acquire resets the scope. A scope
//     fenced off ends the claim at once, as a lost lease does (Flush, or
//     Acquire, drops the conversation), and the next Acquire claims
//     afresh. Only the node's global scope failing fails the service.
//   - A conversation's checkpoint and receipts are in its scope (Scope), so
//     its trims and byte values are fenced by its claim like its appends.
//   - No two live processes share a node id (node/<id> is created under the
//     lease, create-if-absent), and incarnations carry the node's ordinal,
//     so connection ids never collide across nodes.
//
// # Locks
//
// Node.mu guards the lease and the claims; it is never held across an etcd
// call.
package cluster
