package logfirst

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/internal/stage"
	"github.com/participantd/participantd/store/vfs"
	"github.com/participantd/participantd/store/wal"
)

// File names inside the data directory.
const (
	// DBFile is the bbolt file checkpoints write, in store's layout.
	DBFile = "participantd.db"
	// WALDir is the directory of the write-ahead log's segments.
	WALDir = "wal"
	// LogMarkerFile records that WALDir and its first segment were made
	// durable in this directory: from then on a WALDir without a segment
	// is a lost log, refused with ErrLogLost. It is written once, after
	// the first Open's log is durable; a directory that never had one (a
	// restore, a file moved from another directory, an older version)
	// gets it then.
	LogMarkerFile = "wal.created"
)

// metaCheckpointLSN is the meta key holding the LSN of the last record a
// checkpoint applied: 8 bytes, big-endian.
const metaCheckpointLSN = "checkpoint_lsn"

// Defaults of Options.
const (
	DefaultLockTimeout          = time.Second
	DefaultCheckpointInterval   = 100 * time.Millisecond
	DefaultCheckpointBytes      = 1 << 20
	DefaultMaxUncheckpointed    = 64 << 20
	defaultReplayCheckpointSize = 32 << 20
)

// Options configures Open. The zero value means the defaults.
type Options struct {
	// LockTimeout bounds how long Open waits for the data file's lock.
	// Zero or negative means DefaultLockTimeout.
	LockTimeout time.Duration
	// CheckpointInterval is how often committed batches are applied to
	// bbolt. Zero or negative means DefaultCheckpointInterval.
	CheckpointInterval time.Duration
	// CheckpointBytes starts a checkpoint before the interval once this
	// many bytes of committed batches are held in memory. Zero or negative
	// means DefaultCheckpointBytes, 1 MiB: a checkpoint holds about three
	// times what it applies while it commits (the logged batches, bbolt's
	// pages and nodes), and only a stream of large writes reaches 1 MiB in
	// less than the interval (a deaf recipient told 2 GiB of 64 KiB tells:
	// its server's peak 10 MiB lower than at 4 MiB, at the same rate).
	CheckpointBytes int64
	// MaxUncheckpointed bounds the bytes of committed batches held in
	// memory until a checkpoint: a Flush waits while it is reached. Zero
	// or negative means DefaultMaxUncheckpointed.
	MaxUncheckpointed int64
	// SegmentSize is the log's segment size; zero means
	// wal.DefaultSegmentSize.
	SegmentSize int64
	// FS is the file system of the log; nil means the operating system's.
	// The bbolt file is always on the operating system's, but its
	// creation and commits go through FS when FS is a vfs.Committer, and
	// its directory entry is synced with FS.SyncDir.
	FS vfs.FS
	// Logger receives the store's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// MustExist makes Open fail with store.ErrNoData when the bbolt file
	// is missing or 0 bytes, instead of creating it (a directory that has
	// held data must not silently start over). OpenReadOnly always
	// requires it.
	MustExist bool
}

func (o Options) fs() vfs.FS {
	if o.FS == nil {
		return vfs.OS
	}
	return o.FS
}

func (o Options) withDefaults() Options {
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.CheckpointBytes <= 0 {
		o.CheckpointBytes = DefaultCheckpointBytes
	}
	if o.MaxUncheckpointed <= 0 {
		o.MaxUncheckpointed = DefaultMaxUncheckpointed
	}
	return o
}

// ErrReadOnly reports a write to a store opened with OpenReadOnly.
var ErrReadOnly = errors.New("logfirst: read-only store")

// Store is the log-first DurableStore. See the package doc.
//
// A writable Store owns two goroutines, the committer and the
// checkpointer, started by Open and stopped by Close.
type Store struct {
	dir      string
	db       *bolt.DB
	log      *wal.Log // nil when read-only
	opts     Options
	logger   zerolog.Logger
	readOnly bool
	// fresh is set by OpenReadOnly on a file without the store's layout
	// (see startLSN): view then reads nothing from it, as from the empty
	// store Open would lay out.
	fresh bool
	// suspect is set while Open, having found SyncFailedFile, has not
	// yet made durable what the page cache held (the bbolt file
	// rewritten, the replay committed): until then no commit removes the
	// marker. Written by Open before the goroutines start.
	suspect bool
	replay  ReplayStats
	// viewed, when set (tests only), runs after every read transaction
	// of view, without mu held.
	viewed func()

	// ckKick wakes the checkpointer (capacity 1: wakes coalesce and
	// senders never block); the committer's is group's.
	ckKick chan struct{}
	// quit is closed by Close; the goroutines report on done when they
	// stop.
	quit chan struct{}
	done sync.WaitGroup

	flushes     atomic.Uint64
	commits     atomic.Uint64
	appends     atomic.Uint64
	casWrites   atomic.Uint64
	valueLoads  atomic.Uint64
	checkpoints atomic.Uint64

	// ckMu is held by a checkpoint from taking the logged layer to
	// forgetting it, so that checkpoints run one at a time: the
	// checkpointer's, Backup's and Close's. Lock order: filesMu, ckMu,
	// then mu.
	ckMu sync.Mutex
	// rtx is the read transaction point reads of values share (readtx.go).
	rtx readTx
	// pages is bbolt's pages in use in bytes as of its last commit, -1
	// when not known (see notePages).
	pages atomic.Int64

	// filesMu is held shared by a Backup and exclusively by Close while
	// it closes the log and bbolt, so that a backup's checkpoint and copy
	// never run on closed files.
	filesMu sync.RWMutex

	// mu guards every field below. It is never held across a bbolt call,
	// a log write or a channel operation.
	mu sync.Mutex
	// memFreed is signalled on mu when a checkpoint frees memory, when a
	// record is done, and when the store fails or closes.
	memFreed *sync.Cond
	// err is the sticky error of a failed commit or checkpoint; it wraps
	// store.ErrFailed.
	err    error
	closed bool
	// streams holds, for each stream used since Open, its three layers,
	// and the streams with pending payloads not yet taken by a commit;
	// logged holds those with logged payloads not yet taken by a
	// checkpoint.
	streams *stage.Streams[*stream]
	logged  map[string]*stream
	// vals holds the values written and not yet checkpointed (staged,
	// being logged, logged or being checkpointed), which reads see before
	// bbolt, and values read from bbolt; a checkpoint forgets the reads
	// of the keys it wrote only (stage.ForgetLanded). loggedValues holds
	// the latest logged write of each key not yet taken by a checkpoint.
	vals         *stage.Values
	loggedValues map[string]stage.Write
	// bytes holds the latest byte value (nil = deleted) of every key with
	// a PutBytes not yet checkpointed, as vals does for values;
	// stagedBytes and loggedBytes are its staged and logged layers.
	bytes       map[string]bytesState
	stagedBytes map[string]bytesState
	loggedBytes map[string]bytesState
	// stagedTrims and loggedTrims hold, per stream, the highest trim not
	// yet taken by a commit and by a checkpoint.
	stagedTrims map[string]uint64
	loggedTrims map[string]uint64
	// gen numbers byte value writes, so that a checkpoint forgets a key
	// only if no later write of it is in memory.
	gen uint64
	// memBytes counts the bytes of logged, not yet checkpointed writes.
	memBytes int64
	// ckTaken is the part of memBytes a running checkpoint took (0 when
	// none runs): a commit kicks the checkpointer only once the bytes no
	// checkpoint took reach CheckpointBytes (see checkpointDueLocked).
	ckTaken int64
	// lastLSN is the LSN of the last logged batch, ckLSN of the last
	// checkpointed one.
	lastLSN wal.LSN
	ckLSN   wal.LSN
	// group is the group commit: the record being written, by the
	// committer or by a Flush writing its own (one writer of the log at a
	// time), and the next one (its fields are guarded by mu).
	group *stage.Group
}

// stream is the state of one stream: entries [0, base) are in bbolt,
// [base, base+len(logged)) in the log and memory, and the pending ones
// after them are staged or being logged. Entries below first are trimmed:
// never read, whatever bbolt still holds until the trim is checkpointed.
// Slices' elements are never modified, so readers may keep sub-slices
// after releasing mu.
type stream struct {
	first   uint64
	base    uint64
	logged  [][]byte
	pending [][]byte
}

// LenLocked implements stage.Stream.
func (s *stream) LenLocked() uint64 {
	return s.base + uint64(len(s.logged)) + uint64(len(s.pending))
}

// StageLocked implements stage.Stream.
func (s *stream) StageLocked(payload []byte) { s.pending = append(s.pending, payload) }

// bytesState is a byte value in memory: v is nil for a deletion and never
// modified.
type bytesState struct {
	v   []byte
	gen uint64
}

var (
	_ store.DurableStore = (*Store)(nil)
	_ store.Compactor    = (*Store)(nil)
	_ store.PageReader   = (*Store)(nil)
)

// ReplayStats describes what Open replayed from the log.
type ReplayStats struct {
	// CheckpointLSN is the LSN bbolt held when Open began.
	CheckpointLSN wal.LSN
	// Log is what the log held after it.
	Log wal.Info
	// Duration is how long the replay took.
	Duration time.Duration
}

// Open opens or creates the log-first store in dir: the bbolt file DBFile
// and the log in WALDir. It replays the log's records after the bbolt
// file's checkpoint into bbolt, cutting off a torn tail; a corrupt log
// fails with an error wrapping wal.ErrCorrupt that names the segment and
// offset. A data file locked by another process fails after
// opts.LockTimeout with store.ErrLocked.
//
// The bbolt file gets boltstore.Open's checks before bbolt maps it
// (boltfmt.CheckFile): a damaged file fails with store's error naming it
// and wrapping store.ErrCorrupt, as does a panic or memory fault of bbolt
// on any later read or checkpoint of it (that one sticky); a missing or
// 0-byte file is store.ErrNoData when opts.MustExist is set.
func Open(dir string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	fsys := opts.fs()
	// A data directory's entry must be durable before anything in it is:
	// vfs.MkdirAll syncs the parent of each directory it creates. The
	// bbolt file is on the operating system's file system whatever the
	// log's (the same directory when fsys is vfs.OS).
	if err := vfs.MkdirAll(fsys, dir); err != nil {
		return nil, fmt.Errorf("logfirst: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("logfirst: %w", err)
	}
	path := filepath.Join(dir, DBFile)
	if err := boltfmt.CheckFile(path, opts.MustExist); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	created := err != nil || fi.Size() == 0
	var db *bolt.DB
	if err := vfs.Commit(fsys, path, func() error {
		var err error
		db, err = openBolt(path, opts, false)
		return err
	}); err != nil {
		if db != nil {
			db.Close()
		}
		return nil, err
	}
	// After a failed sync the page cache may hold pages of the file that
	// are not on disk: a commit built on them could make a meta page
	// durable that points at pages a power cut loses. The rewrite writes
	// what bbolt has just read, under its lock, so that no process
	// rewrites a file another one serves.
	suspect, err := rewriteAfterFailedSync(fsys, dir, path)
	if err != nil {
		db.Close()
		return nil, err
	}
	if created {
		// bbolt synced the new file's pages, not its directory entry:
		// without this a crash could lose the file, and every checkpoint
		// in it, after the log's segments below them were removed.
		if err := fsys.SyncDir(dir); err != nil {
			db.Close()
			return nil, fmt.Errorf("logfirst: open %s: sync directory: %w", path, err)
		}
	}
	s := newStore(dir, db, opts)
	s.suspect = suspect
	start := time.Now()
	// What OpenReadOnly reads and refuses, refused here before the layout
	// transaction writes the file.
	var ck wal.LSN
	if err := s.view(func(tx *bolt.Tx) (err error) {
		_, ck, err = startLSN(tx)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("logfirst: open %s: %w", path, err)
	}
	if err := checkSpace(fsys, dir, path, opts.SegmentSize); err != nil {
		db.Close()
		return nil, err
	}
	marked, err := checkLogPresent(fsys, dir, ck)
	if err != nil {
		db.Close()
		return nil, err
	}
	if err := boltfmt.Lay(s.update); err != nil {
		db.Close()
		return nil, fmt.Errorf("logfirst: open %s: %w", path, err)
	}
	rp := newReplayer(s.update, ck)
	l, info, err := wal.Open(filepath.Join(dir, WALDir), ck, wal.Options{SegmentSize: opts.SegmentSize, FS: opts.FS}, rp.add)
	if err == nil {
		err = rp.flush()
	}
	if err != nil {
		if l != nil {
			l.Close()
		}
		db.Close()
		return nil, fmt.Errorf("logfirst: replay %s: %w", dir, err)
	}
	if err := markLog(fsys, dir, marked); err != nil {
		l.Close()
		db.Close()
		return nil, err
	}
	if suspect {
		// The bbolt file is rewritten, and the log's replayed records
		// and the replay's commits are durable.
		if err := clearSyncFailed(fsys, dir); err != nil {
			l.Close()
			db.Close()
			return nil, err
		}
		s.suspect = false
	}
	s.log = l
	s.lastLSN, s.ckLSN = rp.lsn, rp.lsn
	s.replay = ReplayStats{CheckpointLSN: ck, Log: info, Duration: time.Since(start)}
	if err := l.RemoveBelow(rp.lsn); errors.Is(err, wal.ErrDirSync) {
		// The log failed: nothing may be appended to it.
		l.Close()
		db.Close()
		return nil, fmt.Errorf("logfirst: open %s: %w", dir, err)
	} else if err != nil {
		s.logger.Warn().Err(err).Msg("removing checkpointed log segments")
	}
	s.done.Add(2)
	go s.runCommitter()
	go s.runCheckpointer()
	return s, nil
}

// OpenReadOnly opens the store in dir without changing any file: bbolt is
// opened read-only and the log's records after its checkpoint are replayed
// into memory, as Open would replay them into bbolt. Reads then see what a
// writable Open would; Append and CAS fail with ErrReadOnly, Flush
// succeeds with nothing to do. A torn tail is left in place and reported
// in Replay. The data file must exist and pass Open's checks: a missing
// or 0-byte one is store.ErrNoData, a damaged one store.ErrCorrupt. A
// file a cut first start left without its layout is read as the empty
// store Open would lay out (Fresh). A lost log is ErrLogLost, as for
// Open.
func OpenReadOnly(dir string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	path := filepath.Join(dir, DBFile)
	if err := boltfmt.CheckFileWhole(path, true); err != nil {
		return nil, err
	}
	db, err := openBolt(path, opts, true)
	if err != nil {
		return nil, err
	}
	s := newStore(dir, db, opts)
	s.readOnly = true
	start := time.Now()
	var ck wal.LSN
	var laid bool
	if err := s.view(func(tx *bolt.Tx) (err error) {
		laid, ck, err = startLSN(tx)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("logfirst: open %s: %w", path, err)
	}
	s.fresh = !laid
	s.lastLSN, s.ckLSN = ck, ck
	if _, err := checkLogPresent(opts.fs(), dir, ck); err != nil {
		db.Close()
		return nil, err
	}
	info, err := wal.Replay(filepath.Join(dir, WALDir), ck, wal.Options{FS: opts.FS}, s.replayIntoMemory)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("logfirst: replay %s: %w", dir, err)
	}
	s.replay = ReplayStats{CheckpointLSN: ck, Log: info, Duration: time.Since(start)}
	return s, nil
}

// minMmapSize is the least a writable bbolt file is mapped at (see
// mmapSize), as etcd maps its backend.
const minMmapSize = 10 << 30

// mmapSize returns the size to map a writable bbolt file of size bytes
// at: at least minMmapSize, and twice the file. bbolt remaps a file it
// grows past its mapping, and a remap waits for every read transaction to
// end: an online backup streams from one read transaction for as long as
// its reader takes, so a checkpoint that had to remap would wait for the
// reader, and once the uncheckpointed log reached its bound every Flush
// with it. The mapping is address space only; pages count once touched.
// On a 32-bit platform it is bbolt's default.
func mmapSize(size int64) int {
	if strconv.IntSize < 64 {
		return 0
	}
	return int(max(minMmapSize, 2*size))
}

func openBolt(path string, opts Options, readOnly bool) (*bolt.DB, error) {
	var db *bolt.DB
	initialMmap := 0
	if fi, err := os.Stat(path); !readOnly && (err == nil || errors.Is(err, fs.ErrNotExist)) {
		var size int64
		if err == nil {
			size = fi.Size()
		}
		initialMmap = mmapSize(size)
	}
	err := boltfmt.Contain(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout:         opts.LockTimeout,
			ReadOnly:        readOnly,
			InitialMmapSize: initialMmap,
			FreelistType:    bolt.FreelistMapType,
			// Only the checkpointer writes this file, off the hot path, so
			// it pays the freelist's page per commit: a start then reads
			// the freelist instead of walking every page (see
			// boltfmt.CheckFile). A file written without one is walked once,
			// by the first open, which writes it.
			NoFreelistSync: false,
		})
		return err
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("logfirst: open %s: waited %v: %w", path, opts.LockTimeout, store.ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("logfirst: open %s: %w", path, err)
	}
	return db, nil
}

func newStore(dir string, db *bolt.DB, opts Options) *Store {
	s := &Store{
		dir:          dir,
		db:           db,
		opts:         opts,
		logger:       opts.Logger.With().Str("component", "logfirst").Logger(),
		group:        stage.NewGroup(),
		ckKick:       make(chan struct{}, 1),
		quit:         make(chan struct{}),
		streams:      stage.NewStreams[*stream](),
		logged:       make(map[string]*stream),
		vals:         stage.NewValues(stage.ForgetLanded),
		loggedValues: make(map[string]stage.Write),
		bytes:        make(map[string]bytesState),
		stagedBytes:  make(map[string]bytesState),
		loggedBytes:  make(map[string]bytesState),
		stagedTrims:  make(map[string]uint64),
		loggedTrims:  make(map[string]uint64),
	}
	s.memFreed = sync.NewCond(&s.mu)
	s.pages.Store(-1)
	return s
}

func checkpointLSN(tx *bolt.Tx) (wal.LSN, error) {
	raw, err := boltfmt.ReadMeta(tx, metaCheckpointLSN)
	if err != nil {
		return 0, err
	}
	switch len(raw) {
	case 0:
		return 0, nil
	case 8:
		return wal.LSN(binary.BigEndian.Uint64(raw)), nil
	default:
		return 0, fmt.Errorf("meta %s: malformed %x", metaCheckpointLSN, raw)
	}
}

// errCheckpointBehind reports a transaction that would record a
// checkpoint LSN below the one bbolt holds.
var errCheckpointBehind = errors.New("logfirst: checkpoint LSN would go back")

// putCheckpointLSN records in tx that bbolt holds every record up to lsn.
// It refuses to lower the LSN (errCheckpointBehind), which would be a
// broken invariant: the log's records up to the LSN held may be removed
// already, so the next Open would find a gap or apply records twice.
func putCheckpointLSN(tx *bolt.Tx, lsn wal.LSN) error {
	cur, err := checkpointLSN(tx)
	if err != nil {
		return err
	}
	if lsn < cur {
		return fmt.Errorf("%w: %v below %v", errCheckpointBehind, lsn, cur)
	}
	raw := make([]byte, 8)
	binary.BigEndian.PutUint64(raw, uint64(lsn))
	return boltfmt.PutMeta(tx, metaCheckpointLSN, raw)
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.dir }

// Fresh reports whether the store was opened read-only on a file bbolt
// created whose layout a cut first start never committed: the empty store
// Open would lay out, with the log, if any, replayed over it.
func (s *Store) Fresh() bool { return s.fresh }

// Replay returns what Open replayed from the log.
func (s *Store) Replay() ReplayStats { return s.replay }

// Stats returns the store's counters: Commits counts log records. It never
// fails, even after Close.
func (s *Store) Stats() store.Stats {
	return store.Stats{
		Flushes:    s.flushes.Load(),
		Commits:    s.commits.Load(),
		Appends:    s.appends.Load(),
		CASWrites:  s.casWrites.Load(),
		ValueLoads: s.valueLoads.Load(),
	}
}

// Checkpoints returns the number of checkpoints applied to bbolt since
// Open.
func (s *Store) Checkpoints() uint64 { return s.checkpoints.Load() }

// usableLocked returns the sticky error, or store.ErrClosed after Close.
// s.mu must be held.
func (s *Store) usableLocked() error {
	if s.err != nil {
		return s.err
	}
	if s.closed {
		return store.ErrClosed
	}
	return nil
}

// view runs fn in a bbolt read transaction with bbolt's panics and
// faults on a damaged page contained (boltfmt.Contain): they come back as
// errors wrapping store.ErrCorrupt. On a fresh store it does not run fn.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	if s.fresh {
		// Every reader finds nothing when fn does not run: no stream, no
		// value, checkpoint LSN 0.
		return nil
	}
	err := boltfmt.Contain(s.db.Path(), func() error { return s.db.View(fn) })
	if s.viewed != nil {
		s.viewed()
	}
	return err
}

// update is view for a write transaction, whose commit goes through the
// log's file system (vfs.Commit), so that a test's faultfs can cut the
// power there. Every commit, a checkpoint's or one of Open's (the layout,
// the replay), is made under SyncFailedFile, an intent: the marker is in
// the data directory before the commit, whose sync may fail, and is
// removed only once the commit succeeded (unless Open has a failed sync's
// marker still to clear). So a process killed at any instant after a
// failed sync, before it could say so, leaves the marker to the next
// Open. An error of fn wrote nothing.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	fsys := s.opts.fs()
	if err := markSyncFailed(fsys, s.dir); err != nil {
		return err
	}
	// The shared read transaction ends first, and none is kept until the
	// commit returned (readtx.go).
	s.endShared(false)
	defer s.writeDone()
	var fnErr error
	err := vfs.Commit(fsys, s.db.Path(), func() error {
		return boltfmt.Contain(s.db.Path(), func() error {
			return s.db.Update(freelistPolicy(func(tx *bolt.Tx) error {
				fnErr = fn(tx)
				return fnErr
			}))
		})
	})
	if err != nil && fnErr == nil {
		s.pages.Store(-1) // what bbolt holds is not known
		return err        // the sync may have failed: the marker stays
	}
	if err == nil {
		s.notePages()
	}
	if !s.suspect {
		// No sync is needed: a removal a power cut undoes costs the next
		// Open one needless rewrite, and the page cache it guards is
		// gone with the power.
		if rerr := fsys.Remove(filepath.Join(s.dir, SyncFailedFile)); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			s.logger.Warn().Err(rerr).Msg("removing the marker of a commit that succeeded; the next start rewrites the data file")
		}
	}
	return err
}

// maxPersistedFreePages bounds the freelist a commit to bbolt persists:
// bbolt writes every free page id (8 bytes each) at every commit that
// persists it, so a file with many free pages (after a compaction freed
// much of it, until writes reuse them) would pay megabytes per checkpoint.
// Past the bound a commit persists none, and an open after it walks the
// file's reachable pages, which are then the smaller part of the file.
// 32,768 ids is 256 KiB per checkpoint, 128 MiB of free space.
var maxPersistedFreePages = 1 << 15

// freelistPolicy wraps fn, the body of a write transaction, so that its
// commit persists bbolt's freelist while that is at most
// maxPersistedFreePages ids. It sets bbolt's NoFreelistSync inside the
// transaction, where bbolt's writer lock serializes it with every commit
// that reads it.
//
// It also sets bbolt's AllocSize, the growth past what a commit needs, to
// the file's size between boltMinGrowth and boltMaxGrowth: bbolt grows a
// file to its mapping while that is small, so with the large mapping
// (mmapSize) it would grow by its 16 MiB AllocSize from the start; this
// keeps its growth geometric while small, as StartSpace reckons it.
func freelistPolicy(fn func(*bolt.Tx) error) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		db := tx.DB()
		st := db.Stats()
		db.NoFreelistSync = st.FreePageN+st.PendingPageN > maxPersistedFreePages
		db.AllocSize = int(min(max(tx.Size(), boltMinGrowth), boltMaxGrowth))
		return fn(tx)
	}
}

func (s *Store) readErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return store.ErrClosed
	}
	return fmt.Errorf("logfirst: read %s: %w", s.db.Path(), err)
}

// lockStream locks s.mu and returns the state of name, first loading its
// bbolt length if the stream was not used since Open (see
// stage.Streams.Get). On error s.mu is not held.
func (s *Store) lockStream(name string) (*stream, error) {
	s.mu.Lock()
	st, err := s.streams.Get(&s.mu, name, s.usableLocked, s.loadStream)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	return st, nil
}

// loadStream returns the state of a stream not used since Open: bbolt
// holds all of it, and no checkpoint can change that while it has nothing
// in memory.
func (s *Store) loadStream(name string) (*stream, error) {
	var n, first uint64
	err := s.view(func(tx *bolt.Tx) error {
		var err error
		if n, err = boltfmt.StreamLen(tx, name); err != nil {
			return err
		}
		first, err = boltfmt.StreamFirst(tx, name)
		return err
	})
	if err != nil {
		return nil, s.readErr(err)
	}
	return &stream{first: first, base: n}, nil
}

// Append implements store.DurableStore. Besides its errors it returns the
// sticky error (wrapping store.ErrFailed) after a failed commit or
// checkpoint, and ErrReadOnly on a read-only store.
func (s *Store) Append(name string, payload []byte, expectedSeq uint64) (uint64, error) {
	return s.append(name, payload, expectedSeq, false)
}

// AppendOwned implements store.Owner: Append without the copy. The
// checkpoint that writes the payload to bbolt seals it in place when it
// has boltfmt.SumLen bytes of spare capacity, and copies it there
// otherwise (boltfmt.PutOwnedEntries).
func (s *Store) AppendOwned(name string, payload []byte, expectedSeq uint64) (uint64, error) {
	return s.append(name, payload, expectedSeq, true)
}

// The spare capacity an owned payload needs is the checksum's.
var _ [store.SealRoom - boltfmt.SumLen]struct{}
var _ [boltfmt.SumLen - store.SealRoom]struct{}

func (s *Store) append(name string, payload []byte, expectedSeq uint64, owned bool) (uint64, error) {
	if err := store.CheckWrite(name, len(payload)); err != nil {
		return 0, err
	}
	if s.readOnly {
		return 0, ErrReadOnly
	}
	// The payload is the logged layer's until a checkpoint writes it: an
	// owned one as it is, any other a copy with room for the checksum the
	// checkpoint seals it with in place (boltfmt.PutOwnedEntries).
	p := payload
	if !owned {
		p = make([]byte, len(payload), len(payload)+boltfmt.SumLen)
		copy(p, payload)
	}
	st, err := s.lockStream(name)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	seq, err := s.streams.AppendLocked(name, st, p, expectedSeq)
	if err != nil {
		return 0, err
	}
	s.appends.Add(1)
	return seq, nil
}

// Len implements store.DurableStore. It reads bbolt only the first time a
// stream is used after Open, and every time for a stream that does not
// exist, which it keeps no state for (stage.Streams.Peek).
func (s *Store) Len(name string) (uint64, error) {
	s.mu.Lock()
	st, err := s.streams.Peek(&s.mu, name, s.usableLocked, s.loadStream)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	defer s.mu.Unlock()
	return st.LenLocked(), nil
}

// ReadFrom implements store.DurableStore: entries below the stream's bbolt
// length come from one bbolt read transaction, the rest from memory. An
// offset below the stream's first entry fails with a
// *store.CompactedError.
func (s *Store) ReadFrom(name string, offset uint64, limit int) ([]store.Entry, error) {
	return s.read(name, offset, limit, 0, nil)
}

// ReadPage implements store.PageReader: ReadFrom that stops before the
// entry that would bring the page past maxBytes, reading bbolt no further
// than that.
func (s *Store) ReadPage(name string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	return s.read(name, offset, limit, maxBytes, nil)
}

// ReadPageBuffered implements store.BufferedPageReader: ReadPage into
// buf's memory.
func (s *Store) ReadPageBuffered(name string, offset uint64, limit int, maxBytes int, buf *store.PageBuffer) ([]store.Entry, error) {
	out, err := s.read(name, offset, limit, maxBytes, buf)
	buf.Keep(out)
	return out, err
}

// read reads entries [offset, offset+limit) of name, at most maxBytes of
// payload (ReadPage), copying the payloads into buf's memory when buf is
// not nil and into their own arrays otherwise.
func (s *Store) read(name string, offset uint64, limit int, maxBytes int, buf *store.PageBuffer) ([]store.Entry, error) {
	st, err := s.lockStream(name)
	if err != nil {
		return nil, err
	}
	end := st.LenLocked()
	if limit > 0 && uint64(limit) <= math.MaxUint64-offset {
		end = min(end, offset+uint64(limit))
	}
	if offset >= end {
		s.mu.Unlock()
		return nil, nil
	}
	if offset < st.first {
		err := &store.CompactedError{Stream: name, Offset: offset, First: st.first}
		s.mu.Unlock()
		return nil, err
	}
	// Taking base before the read transaction begins is what makes the
	// merge safe: a checkpoint advances base only after its transaction is
	// visible to every later reader.
	base := st.base
	loggedEnd := base + uint64(len(st.logged))
	memStart := max(offset, base)
	var logged, pending [][]byte
	if memStart < end && memStart < loggedEnd {
		logged = st.logged[memStart-base : min(end, loggedEnd)-base]
	}
	if end > loggedEnd {
		pending = st.pending[max(memStart, loggedEnd)-loggedEnd : end-loggedEnd]
	}
	s.mu.Unlock()

	var out []store.Entry
	switch {
	case buf != nil:
		out = buf.Reset()
	case maxBytes <= 0:
		out = make([]store.Entry, 0, end-offset)
	}
	total := 0
	if stop := min(end, base); offset < stop {
		full := false
		err := s.view(func(tx *bolt.Tx) error {
			var err error
			out, total, full, err = boltfmt.ReadPageTx(tx, name, offset, stop, maxBytes, 0, out, buf)
			return err
		})
		if err != nil {
			return nil, s.readErr(err)
		}
		if len(out) == 0 || out[0].Seq != offset {
			// A trim made after the check above was checkpointed before
			// the read transaction began.
			s.mu.Lock()
			first := st.first
			s.mu.Unlock()
			return nil, &store.CompactedError{Stream: name, Offset: offset, First: first}
		}
		if full {
			return out, nil
		}
	}
	seq := memStart
	for _, mem := range [2][][]byte{logged, pending} {
		for _, p := range mem {
			if maxBytes > 0 && len(out) > 0 && total+len(p) > maxBytes {
				return out, nil
			}
			total += len(p)
			out = append(out, store.Entry{Seq: seq, Payload: buf.Copy(p)})
			seq++
		}
	}
	return out, nil
}

// CAS implements store.DurableStore. Besides its errors it returns the
// sticky error after a failure, and ErrReadOnly on a read-only store.
func (s *Store) CAS(key string, old, new uint64) error {
	if err := store.CheckWrite(key, 0); err != nil {
		return err
	}
	if s.readOnly {
		return ErrReadOnly
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	actual, err := s.vals.Current(&s.mu, key, s.usableLocked, s.loadValue)
	if err != nil {
		return err
	}
	if actual != old {
		return &store.CASConflictError{Key: key, Expected: old, Actual: actual}
	}
	s.vals.StageLocked(key, new)
	s.casWrites.Add(1)
	return nil
}

// ReadValue implements store.DurableStore. A value read from bbolt is
// cached until a checkpoint writes its key, so that a token lookup and
// the CAS that follows it read the file once.
func (s *Store) ReadValue(key string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vals.Read(&s.mu, key, s.usableLocked, s.loadValue)
}

func (s *Store) loadValue(key string) (uint64, error) {
	s.valueLoads.Add(1)
	var v uint64
	err := s.readShared(func(tx *bolt.Tx) error {
		var err error
		v, err = boltfmt.ReadValueTx(tx, key)
		return err
	})
	if err != nil {
		return 0, s.readErr(err)
	}
	return v, nil
}

// Scan implements store.DurableStore: values in memory overlay the ones
// read from bbolt in one read transaction.
func (s *Store) Scan(prefix string) ([]store.Value, error) {
	s.mu.Lock()
	if err := s.usableLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	overlay := s.vals.OverlayLocked(prefix)
	s.mu.Unlock()

	var out []store.Value
	err := s.view(func(tx *bolt.Tx) error {
		var err error
		out, err = boltfmt.ScanValues(tx, prefix, func(k string) bool {
			_, ok := overlay[k]
			return ok
		})
		return err
	})
	if err != nil {
		return nil, s.readErr(err)
	}
	return stage.MergeScan(out, overlay), nil
}

// InUse returns the bytes the store holds: the bbolt file's pages in use
// (boltfmt.PagesInUse: its free pages do not count) plus the bytes logged
// and not yet checkpointed, which a checkpoint moves there. While a
// checkpoint commits, the bytes it moves count twice for a moment. It
// fails with the sticky error, or store.ErrClosed after Close.
func (s *Store) InUse() (int64, error) {
	s.mu.Lock()
	err, logged := s.usableLocked(), s.memBytes
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n := s.pages.Load()
	if n < 0 {
		if err := s.view(func(tx *bolt.Tx) error { n = boltfmt.PagesInUse(tx); return nil }); err != nil {
			return 0, s.readErr(err)
		}
		// A write that committed meanwhile noted its own count.
		s.pages.CompareAndSwap(-1, n)
	}
	return n + logged, nil
}

// notePages notes bbolt's pages in use after a write transaction
// committed, which alone changes them, so that InUse, which every tell
// and enroll asks, reads no transaction: -1, which InUse reads as
// unknown, if they cannot be read. It runs before a checkpoint forgets
// the bytes it moved from memBytes, so that InUse counts them twice for a
// moment, never not at all.
func (s *Store) notePages() {
	var n int64
	if err := s.view(func(tx *bolt.Tx) error { n = boltfmt.PagesInUse(tx); return nil }); err != nil {
		n = -1
	}
	s.pages.Store(n)
}
