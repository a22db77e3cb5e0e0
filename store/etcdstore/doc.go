// Package etcdstore is a store.DurableStore kept in an etcd v3 cluster, for
// participantd's cluster mode: the data is Raft-replicated by etcd, and every
// commit can be fenced by an ownership key so that a node that lost a
// conversation is refused by etcd itself.
//
// # Layout
//
// Every key starts with Options.Prefix. Options.Scope maps each stream or
// value name to a scope (for participantd: the conversation), and all of a
// scope is one key range: c/<scope>/ followed by s/ (stream runs, keyed by
// a 2-byte name length, the name and the 8-byte BE seq of the run's first
// entry, so one stream's runs are a range of their own in seq order), f/
// (a trimmed stream's floor), v/ (values) or b/ (byte values); g/ holds
// the names of the global scope. The table of every stored key, with its
// value and owner, is in docs/DESIGN.md, "Stored keys"; it is the one home
// of the layout.
//
// # Layouts
//
//	layout | entries                              | a stream's length
//	1      | one key per entry, its payload       | its l/ key
//	2      | one key per stream per commit (run)  | last run's seq + count
//
// This version writes layout 2 and reads both (runs.go): a layout 1 entry
// is a run of one, so a stream may hold layout 1 entries then runs. It
// never reads or writes l/ keys, which layout 1 data keeps. The cluster's
// format key says which layouts a prefix may hold (cluster/format.go), so
// that no binary that writes layout 1 runs on a prefix holding runs.
//
// # Checksums
//
// Every value put is sealed (seal.go): its body, a tag byte (0x01, 0x02
// for a run) and the CRC-32C of the key relative to Options.Prefix, a zero
// byte, the body and the tag; each entry inside a run is sealed as well,
// under the key it would have in layout 1. Every read of a value (runs
// and each of their entries in ReadPage and at a stream's load, floors,
// values in reads, batched reads and Scan, byte values) checks it, and a
// mismatch is a *store.ChecksumError (errors.Is store.ErrCorrupt) naming
// the key, never a value served nor taken for absent. Compares of a value
// in a transaction compare the sealed bytes (the trailer is a function of
// the key and body), so fencing is unchanged.
//
// # Contract
//
// As store.DurableStore: appends and CASes stage in memory and are visible
// at once; a Flush that returns nil made every write before it durable
// (committed by a quorum of etcd members). What differs:
//
//   - Failure is per scope. A commit that etcd refused (a fence or a length
//     or value compare failed) or whose outcome is unknown fails the scopes
//     it wrote, with a sticky error wrapping store.ErrFailed and ErrFenced,
//     ErrConflict or ErrUnknownOutcome; every later call on a name of that
//     scope returns it until Reset. Other scopes keep working. Flush
//     reports every failed scope; FlushScopes only the scopes it names.
//   - Payloads are limited to what fits one etcd request (MaxPayloadLen),
//     refused at Append with store.ErrTooLarge.
//   - Scan walks every key of the prefix (for offline tools), unless
//     Options.ScanScope reports that every name under the prefix asked has
//     the prefix's scope: then it reads that scope's range of the prefix alone,
//     values with keys, so that a conversation's scan costs its own keys,
//     not the data set's.
//
// The Store is also a store.Compactor and a store.PageReader. Trim and
// PutBytes stage like Append and CAS (visible at once, committed by the
// next Flush in the scope's fenced transaction, so a fenced-off node can
// neither trim nor overwrite a checkpoint). A trim is one DeleteRange of
// the stream's runs below the run holding its floor (found when the trim
// is staged), compared on that run existing, and a put of the stream's
// floor key: the run straddling the floor stays whole, so seqs never move
// and the stream keeps its last entry. A stream's first entry is its floor
// or its first run's first seq, whichever is later. A read below it is a
// *store.CompactedError, also when another store trimmed: ReadPage reads
// the floor key with the run holding its offset, and entries missing at
// the front of a range are compacted, missing elsewhere corrupt. Byte
// values are limited to MaxPayloadLen as payloads are. ReadPage reads
// whole runs, in etcd ranges sized from the bytes left at the average run
// size read so far (4 runs first), so a page fetches about its byte bound.
//
// # Commit
//
// One committer goroutine, owned by the Store and stopped by Close, takes
// every staged write when a Flush asks for it (Flushes arriving during a
// commit form the next one: group commit) and writes them as transactions.
// A scope is in one commit at a time; with Options.MaxInflightCommits above
// one, a commit of other scopes may start while one is in flight. A Flush
// waits until the writes of its scopes staged before it are durable (each
// scope counts its staged and its durable writes):
//
//	If   no run of each touched stream at or after its length last
//	     committed or read (one range compare per stream)
//	     each CAS'd value = its last committed or read value
//	     each touched scope's fence key has the fence's mod revision
//	     each trim's floor run exists
//	     each byte value's mod revision <= the scope's revision
//	Then put each stream's entries as one run (several past MaxRunBytes),
//	     the values (delete for 0), the byte values (delete for empty);
//	     delete the runs below each trim's floor run, put its floor
//
// (no Else: see below)
// so that no two writers can commit the same seq of a stream: a stream never
// forks (a writer that knew a shorter stream finds the other's runs in
// its range). A fenced scope loaded under its current claim
// (after settling, after its last commit in flight had an outcome, with no
// value cached from before) compares its fence alone: nobody else commits
// under the claim, so what the store holds of the scope is what etcd
// holds, and the run and value compares could only cost etcd a range
// each. A reset, a failure or a new claim makes it compare them again
// until it reloads. A scope's revision is the etcd revision it was loaded at,
// advanced to each transaction of the scope that commits: a byte value that
// another writer changed since is not overwritten (the scope fails with
// ErrConflict), while the store rewrites its own freely. The transactions
// of one commit run concurrently (at most 16 at a time), except the chunks
// of a split scope, which run in order.
//
// A refused transaction is explained by one linearizable read of its
// compared keys, made after the refusal rather than as Else reads inside
// it: nearly every commit succeeds, and Else reads would be bytes every
// member unmarshals and logs for nothing. The read sees at least what the
// refusal saw (a fence once gone or moved never returns to its mod revision;
// lengths and byte values' revisions only grow; a trimmed entry stays
// gone), so a compare that failed still fails: the scopes whose compares
// fail now fail (ErrFenced for a fence, ErrConflict otherwise, and for a
// fence key that still holds the claim but was written behind the store,
// which then settles the scope) and the
// transaction runs again without them (at most once per failed scope), so
// a fenced-off scope fails only itself. When nothing fails in the read
// (a value changed and back) or the read fails, every scope of the
// transaction fails with ErrConflict: a refusal is never blamed on nobody.
//
// # Atomicity
//
// A transaction holds at most Options.MaxTxnOps compares and as many writes,
// and stays below Options.MaxRequestBytes. Scopes are packed whole while
// they fit; a scope that alone passes a limit is cut along its log (see
// Order), each stream's chunk comparing no run at or after the length the
// previous chunk wrote, and its transactions run in order. A chunk of a
// stream is written as runs of at most Options.MaxRunBytes (an entry
// larger than that is a run of its own), so no run passes a request.
// Atomic is exactly one transaction: if a later one fails, a prefix of the
// scope's writes is durable and the scope fails (never a gap). A scope
// that fits one transaction commits all or nothing.
//
// # Order
//
// Each scope's writes keep their order across a crash (store.ScopeOrdered):
// what etcd holds of a scope after any failure is a prefix of its writes
// in the order their calls returned, whichever commits carried them. A
// scope is in one commit at a time, its commits run one after the other,
// and none runs after a failed one (the scope's error is sticky until
// Reset, which discards what was staged). A scope records its writes in
// one log, in order as they are staged (consecutive appends to one stream
// as one write); it is the one record of what the scope staged, from
// which a commit gathers what it writes: each stream's entries as one
// chunk, each value's, byte value's and trim's last write. Within a
// commit, a scope that fits one transaction is atomic. One that does not
// is cut along its log: each transaction takes the writes that follow the
// previous one's, gathered within it as a whole scope's are, so that a
// value or byte value written on both sides of a cut is written by both
// transactions, each with what its stretch left it (a byte value written
// by an earlier transaction of the same commit is compared against that
// transaction's revision). A failed
// or unknown transaction leaves the writes up to its own cut, or to the
// one before it. Writes of different scopes keep no order: scopes commit
// in concurrent transactions and fail alone
// (TestStore_AScopeCutOverTransactionsKeepsItsOrder cuts a scope of
// nineteen writes over four transactions and fails each, refused, unknown
// and not applied, unknown and applied).
//
// # Reads
//
// A scope loads on first use: one linearizable read gives its revision
// (and lists its values, see below). Each stream's length loads on its
// first use after that, one descending range limited to its last run;
// afterwards the store knows them (it is the scope's only writer). Values read are cached per scope until that scope's next
// commit (an exact scope keeps up to maxKeptReads of them longer: see
// below), so memory stays bounded by what is read between two commits.
// Reads of runs, lengths, byte values and unfenced values are
// linearizable. Values of a fenced scope are read serializably, pinned at
// the scope's revision (loaded first if need be): the store being the
// scope's only writer, the value there is the current one, and a read
// never sees less than what the store committed or loaded after its
// claim, which matters because the caller decides on reads without a
// commit (a token index entry absent: a new request). A member that has
// not applied that revision (lagging, cut off from its peers) refuses the
// read as a future revision instead of answering stale data, and the
// batch is read again linearizably; so is one whose revision etcd
// compacted away. A scope loaded under its claim (see Commit) also lists
// its value keys at the load and keeps them, with the values it commits
// afterwards, in a Bloom filter bounded in bytes (known.go): a read of a
// value the filter never saw (a new token's index entry) is answered
// absent without a request, and keeps up to maxKeptReads values read
// across its commits (only its own CASes change them). Those reads (one per token lookup in participantd) share
// requests: a read sends what is queued as one read-only transaction of
// serializable Gets (at most MaxTxnOps) while fewer than
// Options.MaxInflightReads such batches are in flight, and otherwise
// queues for the next, sent by one of the queued readers when a batch
// returns. A read therefore waits for at most one batch in flight; batches
// grow with load only, with no timer. A failed batch fails each of its
// reads, nothing else.
//
// # Settling
//
// A transaction whose outcome is unknown may still apply in etcd at any
// later time. A fenced scope one left behind is settled before it is read
// again (on the first use after its Reset): one transaction "if the fence
// key has the claim's create revision, put it again with its value and
// lease", which moves the key's mod revision past the one every earlier
// transaction compares. The lost transaction has then either applied,
// and the reload that follows sees it, or never will: what the caller
// reconciles from is final. A settle whose own outcome is unknown leaves
// the scope to settle again; one refused (the claim gone) fails the scope
// with ErrFenced. Settling costs one write after an unknown outcome only.
// A scope without a fence is not settled.
//
// # Leader affinity
//
// With Options.DialLeader and more than one endpoint, commit transactions
// (and the read that explains a refusal) go through a second client
// connected to the etcd leader alone: a follower forwards every proposal
// to the leader, which costs etcd a second decode and encode and a hop.
// Batched and other reads stay on the main client (serializable reads are
// answered by any member without forwarding). One goroutine, owned by the
// Store and stopped by Close, finds the leader (Maintenance.Status on each
// endpoint, the pinned one first: the endpoint whose member is the leader,
// else the leader's client URL from MemberList) at once, every
// Options.LeaderCheckInterval and, at most once a second, when a commit
// asks; it dials the new leader when the leader changed and retires the
// old client, which it closes once no call runs on it (a call counts
// itself in and out), so a switch fails no commit in flight.
//
// Commits never wait for discovery: they use whatever client is pinned, or
// the main client when none is. A call on the leader client that fails
// (the member lost, its leadership lost, a timeout) has the outcome any
// failed call has (ErrUnknownOutcome; it is never retried) and unpins the
// client, so later commits go through every endpoint until discovery pins
// the leader again; so does a leader connection gRPC reports failing,
// before a commit is sent on it. When discovery fails nothing is pinned.
//
// # Locks
//
// Store.mu guards the scopes and the committer; Store.rmu guards the queue
// of batched reads. Neither is held across an etcd call or a channel
// operation, and they are never held together. leaderConn.mu guards only
// its list of retired clients.
package etcdstore
