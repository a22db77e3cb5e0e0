// Package offline is how participantctl's offline tools (inspect,
// verify, compact, backup --data, restore) open a stopped server's data
// directory. It is a package, not part of the binary, so that the crash
// loops of the tests run exactly what an operator runs on a directory a
// crash left.
//
// A data directory the log-first engine wrote is two things:
//
//	path                      content
//	<dir>/participantd.db     bbolt: every record up to its checkpoint LSN
//	<dir>/wal/                the log: the records after it
//
// After a SIGKILL or a power cut the records after the checkpoint LSN are
// in the log alone, and the next open of the daemon replays them into the
// file, each value as the log holds it. The file alone is therefore not
// the store, and a tool must never write it alone: a value it wrote would
// be overwritten by the replay of an older one (a token floor lowered
// under entries already forgotten, an older checkpoint put back over
// trimmed rows), and a retry would commit twice. So:
//
//	tool                 opens                           changes on disk
//	inspect, verify      OpenReadOnly: the file read     nothing
//	                     only, the log replayed in
//	                     memory over it
//	compact, backup      OpenWritable: as the daemon     the log replayed into
//	                     does, the log replayed into     the file, then the
//	                     the file, every write through   tool's writes, through
//	                     the log                         the log, checkpointed
//	                                                     by Close
//
// Which of the two a directory is, and whether it can be opened at all,
// is decided by package logfirst, as at the daemon's start: a directory
// the log-first engine started in (logfirst.Started: wal/ or
// wal.created) is opened only with its log, and one whose log was made
// durable and is now lost fails with logfirst.ErrLogLost for every tool.
// Any other (one only --store bbolt ever served, a restore) is the bbolt
// file alone: the readers still go through logfirst.OpenReadOnly, which
// finds no log, and the writers open it with package store. A file a
// power cut left as bbolt created it, before the first start committed
// the store's layout, is the empty store the next start lays out: the
// readers report it without writing, the writers lay it out first. A
// missing or 0-byte file is store.ErrNoData: no tool creates a store.
//
// A directory whose log holds records after the file's checkpoint is
// served whole only through the log: Replay reports what the log holds
// after it (verify prints it), Pending how many records, so that a tool
// that copies the file alone (restore --from <dir>/participantd.db)
// refuses it.
//
// CheckFile reads one bbolt file whole, read-only: OpenReadOnly's check of
// the data file, and restore's of a backup before it writes anything.
package offline
