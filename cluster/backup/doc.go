// Package backup writes, checks and restores backups of a participantd
// cluster's data set: every key under the cluster's etcd prefix, read at
// ONE etcd revision, so that the copy is a state etcd itself was in (every
// commit before that revision whole, none after it), whatever the nodes
// were doing while it streamed.
//
// # File format (version 1)
//
//	magic    "PDCLBAK\n" (8 bytes)
//	frame*   type (1 byte) | body length (4 bytes, big endian) | body
//
//	type  body (msgpack)                                       where
//	'H'   Header {format, prefix, revision, keys, created}     first
//	'E'   [key, value]: key relative to the prefix, raw bytes  keys times, ascending key order
//	'T'   Trailer {keys, sha256}                               last, then end of file
//
// Trailer.SHA256 is the SHA-256 of every byte of the file before the
// trailer frame (magic, header, entries). A body is at most MaxFrameBytes.
// A reader refuses a file whose magic, format version, framing, key order,
// entry count or checksum is not as written, and anything after the
// trailer: a cut or damaged copy is never taken for a whole one.
//
// # What is in a backup
//
// Every key of the prefix except the claims that live under a node's lease
// (cluster.Ephemeral: node/<id>, own/<conversation>): the data (d/…), the
// cluster secret (secret/node-key) and the node ordinals. A restored data
// set therefore has no owners and no live nodes; every conversation is
// claimed afresh on its first touch and reconciled from its rows, so
// bindings of the backup's time end as died/unclean_restart, as after a
// crash.
//
// # Memory
//
// Export reads in pages of about Options.PageBytes (as many keys as fit at
// the largest entry seen so far, at most Options.MaxPageKeys) and writes
// each entry as it goes, so it holds one page; Check and Restore read one
// frame at a time. Only Load (the offline tools' view of a file) holds the
// whole data set.
package backup
