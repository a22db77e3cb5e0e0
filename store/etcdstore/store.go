package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/store"
)

// Defaults for the zero Options. The limits are etcd's own defaults
// (--max-txn-ops, --max-request-bytes); a cluster configured with larger
// ones may be given larger ones here, never smaller ones there.
const (
	DefaultPrefix          = "/participantd/"
	DefaultMaxTxnOps       = 128
	DefaultMaxRequestBytes = 3 << 19 // 1.5 MiB
	DefaultTimeout         = 5 * time.Second
	// DefaultMaxInflightReads lets a read start while one batch is in
	// flight, so that a lone read never waits for another.
	DefaultMaxInflightReads = 2
	// payloadReserve is what a transaction needs beside one payload: its
	// keys, compares, the fence and the request's framing.
	payloadReserve = 64 << 10
	// readPage is how many entries one range read returns at most.
	readPage = 256
	// DefaultMaxRunBytes bounds a run (runs.go): the entries of one
	// stream that one commit writes as one key. A read of one entry
	// fetches its whole run, so runs stay far below a request.
	DefaultMaxRunBytes = 64 << 10
)

// Sentinel errors. A failed scope's sticky error wraps store.ErrFailed and
// exactly one of ErrFenced, ErrConflict and ErrUnknownOutcome.
var (
	// ErrFenced reports a scope whose fence no longer holds: the ownership
	// key is gone or belongs to a newer claim, so etcd refused the commit
	// and nothing of it was written.
	ErrFenced = errors.New("etcdstore: fenced off")
	// ErrConflict reports a scope that another writer changed behind this
	// store's back: a stream's runs or a value were not what this store last
	// committed or read. Nothing of the refused transaction was written.
	ErrConflict = errors.New("etcdstore: scope changed by another writer")
	// ErrUnknownOutcome reports a transaction that may or may not have
	// committed (timeout, lost connection).
	ErrUnknownOutcome = errors.New("etcdstore: transaction outcome unknown")
	// ErrNotFenced reports a write to a scope that has no fence while
	// Options.RequireFence is set. Nothing is staged.
	ErrNotFenced = errors.New("etcdstore: scope has no fence")
	// ErrCorrupt reports a key or value of the layout that cannot be read:
	// a value that is not 8 bytes, a run that does not parse, an entry
	// missing below a stream's length.
	ErrCorrupt = errors.New("etcdstore: corrupt data")
)

// Fence guards every commit of one scope: the transaction also compares
// that Key has the mod revision the store last gave it, CreateRevision
// (the revision of the claim that created it) until the store settles the
// scope (see doc.go). A lease that expired deletes the key and a newer
// claim recreates it, so either refuses the commit in etcd itself. Nothing
// but the store may write Key while the claim lasts.
type Fence struct {
	Key            string
	CreateRevision int64
}

// Options configures Open. The zero value means the defaults.
type Options struct {
	// Prefix is prepended to every key; default DefaultPrefix.
	Prefix string
	// Scope maps a stream or value name to its scope: all names of one
	// scope share one key range and one sticky error, and a fence guards a
	// scope. "" is the global scope; a scope containing '/' is treated as
	// global. Nil puts every name in the global scope.
	Scope func(name string) string
	// RequireFence refuses writes to a non-global scope that has no fence.
	RequireFence bool
	// ScanScope, if set, reports whether every name that begins with
	// prefix has prefix's own scope (a conversation's token index, say);
	// Scan of such a prefix then reads one etcd range, the prefix's values
	// in that scope. Nil, or false for a prefix, means Scan walks every
	// key of the store.
	ScanScope func(prefix string) bool
	// MaxTxnOps and MaxRequestBytes are the etcd cluster's limits;
	// defaults DefaultMaxTxnOps and DefaultMaxRequestBytes.
	MaxTxnOps       int
	MaxRequestBytes int
	// MaxRunBytes bounds the run a commit writes of one stream (its
	// entries beyond it go in further runs; an entry larger than it is a
	// run of its own); default DefaultMaxRunBytes, and never more than
	// one request holds.
	MaxRunBytes int
	// Timeout bounds every etcd call; default DefaultTimeout.
	Timeout time.Duration
	// MaxInflightCommits is how many group commits may be in flight at
	// once, each over scopes no other is writing. One (the default) makes
	// the biggest batches, which is what a CPU-bound etcd wants; more lets
	// a barrier start without waiting for the commit in flight, which
	// helps when etcd is bound by its latency rather than its CPU.
	MaxInflightCommits int
	// MaxInflightReads is how many batched reads of fenced values may be
	// in flight at once (see read.go); reads that arrive meanwhile share
	// the next request. Default DefaultMaxInflightReads.
	MaxInflightReads int
	// DialLeader, if set, turns leader affinity on (see doc.go): commit
	// transactions go through a client on the etcd leader alone, dialled
	// as DialLeader(ctx, endpoint) with the settings (TLS, credentials) of
	// the client given to Open (ctx is cancelled by Close, and should be
	// the client's Config.Context), and owned and closed by the Store. Nil, a
	// client with one endpoint, or OpenKV: everything goes through the
	// client given to Open.
	DialLeader func(ctx context.Context, endpoint string) (*clientv3.Client, error)
	// LeaderCheckInterval is how often the leader is asked for while
	// DialLeader is set; default DefaultLeaderCheckInterval.
	LeaderCheckInterval time.Duration
	// Logger receives the store's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// MaxFilterBytes bounds the memory of the filters that answer reads
	// of absent values without etcd (see known.go); default
	// DefaultMaxFilterBytes, negative for no filters.
	MaxFilterBytes int
	// OnTxn, if set, is told about every commit transaction: its latency,
	// its number of operations and its outcome (nil, or the error that
	// failed at least one of its scopes). It must not block.
	OnTxn func(d time.Duration, ops int, err error)
}

// Store is a store.DurableStore kept in etcd. Appends and CAS writes stage
// in memory and are visible at once; Flush commits them with group commit
// as fenced, compared etcd transactions (see doc.go).
//
// A Store owns one committer goroutine, started by Open and stopped by
// Close, and with leader affinity the goroutine of its leader connection
// and the clients that dials. It does not own the etcd client given to
// Open.
type Store struct {
	kv clientv3.KV
	// leader is the connection to the etcd leader that commits use; nil
	// without leader affinity.
	leader     *leaderConn
	lay        layout
	opts       Options
	maxPayload int
	log        zerolog.Logger

	// kick wakes the committer (capacity 1: wakes coalesce); quit stops it
	// and done is closed when it has stopped.
	kick chan struct{}
	quit chan struct{}
	done chan struct{}

	flushes   atomic.Uint64
	commits   atomic.Uint64
	appends   atomic.Uint64
	casWrites atomic.Uint64
	txns      atomic.Uint64
	// reads counts the batched read requests sent (see read.go), and
	// caughtUp the requests that sent a batch again because the member
	// had not reached its revision (or etcd compacted it); settles counts
	// the settles that reached etcd.
	reads    atomic.Uint64
	caughtUp atomic.Uint64
	settles  atomic.Uint64
	// loadWaits counts the loads of a fenced scope that waited for a
	// commit taken before its reset (see loadedLocked).
	loadWaits atomic.Uint64
	// memReads counts the value reads answered absent by a scope's filter.
	memReads atomic.Uint64
	// filterSeed hashes the filters' keys.
	filterSeed maphash.Seed

	// rmu guards the batched reads' queue and turns; it is never held
	// with mu, across an etcd call or a channel operation.
	rmu     sync.Mutex
	rqueue  []*readReq
	ractive int

	// mu guards every field below. It is never held across an etcd call or
	// a channel operation.
	mu     sync.Mutex
	closed bool
	scopes map[string]*scope
	// changed is closed (and replaced) whenever a commit completed or the
	// store closed: Flushes wait on it and check their scopes again.
	changed chan struct{}
	// active counts the commits in flight (at most maxInflightCommits).
	active int
	// filterBytes is the memory of every scope's filter (known.go).
	filterBytes int
}

// scope is the state of one scope. Guarded by Store.mu.
type scope struct {
	name string
	// claim is the last fence set (SetFence); fenced reports whether it
	// still guards the scope's commits (Drop ends that). fenceMod is the
	// mod revision of the claim's key as this store last wrote it: the
	// claim's create revision, or the revision of the store's last settle
	// (see settle). Commits compare it, so a settle refuses every
	// transaction sent before it. claim, fenceMod and unsettled survive a
	// reset and a Drop: they describe the last fence set, whose
	// transactions may still be in flight.
	claim    Fence
	fenced   bool
	fenceMod int64
	// unsettled is set when a commit of the scope ended with its outcome
	// unknown: the transaction may still apply in etcd, so the scope is
	// settled (a write that refuses it) before it is read again.
	unsettled bool
	// err is the sticky error of a failed commit (wraps store.ErrFailed).
	err error
	// epoch advances at every reset and failure, so that a commit or a load
	// begun before it does not install stale state.
	epoch   uint64
	streams map[string]*stream
	values  map[string]*value
	// reads caches values of the scope read (not written) since the
	// scope's last commit; that commit forgets them, so the cache is
	// bounded by what is read between two commits of the scope (an exact
	// scope keeps up to maxKeptReads of them across its commits: only its
	// own CASes change them, and a CAS drops its key from reads).
	// readEpoch advances at every commit of the scope, so a read that
	// raced one is not cached.
	reads     map[string]uint64
	readEpoch uint64
	// loaded is set once the scope's revision was read (and whether it is
	// exact decided); each stream's length is read on its first use.
	loaded bool
	// exact is set when the scope was loaded under the current claim,
	// after every transaction the store sent under it had completed and
	// with no value cached from before: what the store holds of the scope
	// is then etcd's, and stays so while the fence holds (nobody else
	// commits under it), so its commits compare the fence alone (see
	// doc.go, Commit). A reset, a failure or a new claim clears it.
	exact bool
	// known, when set (an exact scope), holds every value name of the
	// scope that may exist in etcd (known.go).
	known *keyFilter
	// inflight is the commit writing the scope, nil when none: a scope is
	// in at most one commit at a time.
	inflight *scopeWork
	// log is every write staged since the last commit of the scope
	// began, in the order the calls returned, and the one record of
	// them: a commit gathers from it what it writes (gatherLocked), and
	// one that must split the scope over several transactions cuts it
	// in that order, so that what a crash leaves of the scope is a prefix
	// of its writes (see doc.go, Order). logHint is how many writes the
	// last commit took of it (see logLocked).
	log     []write
	logHint int
	// wanted is set when a Flush waits for the scope's dirty writes; only
	// then does a commit start (and take every dirty scope along), so that
	// writes nobody flushed are committed only by riding along.
	wanted bool
	// staged counts the writes ever staged in the scope and durable those
	// made durable, so that a Flush knows when its writes are.
	staged, durable uint64
	// bytes holds the byte values (store.Compactor) with a write staged or
	// in flight, nil meaning deleted.
	bytes map[string]*byteValue
	// rev is the etcd revision up to which the store knows the scope: the
	// revision it was loaded at, advanced by each of its
	// commits. A byte value commits only if etcd's copy was last modified
	// at or before rev (see doc.go, Commit). Set with loaded.
	rev int64
}

// dirty reports whether the scope has writes staged since its last commit
// began.
func (sc *scope) dirty() bool { return len(sc.log) > 0 }

// pending reports whether the scope has writes not yet durable.
func (sc *scope) pending() bool { return sc.durable < sc.staged }

// stream is the state of one stream used since Open (or the scope's last
// reset). Guarded by Store.mu.
type stream struct {
	// committed is the number of entries in etcd.
	committed uint64
	// pending holds entries committed.. not yet durable; elements are never
	// modified once appended, so readers may keep a sub-slice. The first
	// taken of them are being written by the commit in progress (none
	// while no commit of the scope is in flight).
	pending [][]byte
	taken   int
	// first is the seq of the stream's first stored entry, known once
	// firstKnown is set (read from etcd, or set by a staged Trim, which
	// makes it visible at once); trimTo is the floor of the trim staged
	// and not yet taken by a commit (0: none), trimRun the first seq of
	// the run holding it.
	first      uint64
	firstKnown bool
	trimTo     uint64
	trimRun    uint64
}

func (st *stream) lenLocked() uint64 { return st.committed + uint64(len(st.pending)) }

// value is the state of one value with a write staged or in flight.
// Guarded by Store.mu.
type value struct {
	committed uint64 // the value in etcd (0 = absent)
	cur       uint64 // the value including staged writes
	gen       uint64 // advances at every CAS
	taken     uint64 // the gen of the last write a commit took
}

// Open returns a Store on cli. The caller keeps ownership of cli and closes
// it after Close.
func Open(cli *clientv3.Client, opts Options) *Store { return open(cli.KV, cli, opts) }

// open opens a Store on kv; cli, if not nil, is the client kv belongs to,
// which leader affinity asks for the leader.
func open(kv clientv3.KV, cli *clientv3.Client, opts Options) *Store {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = DefaultMaxTxnOps
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxRunBytes <= 0 {
		opts.MaxRunBytes = DefaultMaxRunBytes
	}
	opts.MaxRunBytes = max(min(opts.MaxRunBytes, opts.MaxRequestBytes-payloadReserve), 1)
	if opts.MaxInflightCommits <= 0 {
		opts.MaxInflightCommits = 1
	}
	if opts.MaxInflightReads <= 0 {
		opts.MaxInflightReads = DefaultMaxInflightReads
	}
	if opts.LeaderCheckInterval <= 0 {
		opts.LeaderCheckInterval = DefaultLeaderCheckInterval
	}
	if opts.MaxFilterBytes == 0 {
		opts.MaxFilterBytes = DefaultMaxFilterBytes
	}
	s := &Store{
		kv:         kv,
		lay:        layout{prefix: opts.Prefix, scope: opts.Scope},
		opts:       opts,
		maxPayload: max(opts.MaxRequestBytes-payloadReserve, 1),
		log:        opts.Logger.With().Str("component", "etcdstore").Logger(),
		kick:       make(chan struct{}, 1),
		changed:    make(chan struct{}),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
		scopes:     make(map[string]*scope),
		filterSeed: maphash.MakeSeed(),
	}
	if cli != nil && opts.DialLeader != nil && len(cli.Endpoints()) > 1 {
		s.leader = newLeaderConn(cli, opts.DialLeader, opts.LeaderCheckInterval, s.log)
	}
	go s.run()
	return s
}

// MaxPayloadLen returns the largest payload Append accepts: what fits in
// one etcd request beside the keys of its transaction.
func (s *Store) MaxPayloadLen() int { return s.maxPayload }

// ScopePrefix returns the etcd key prefix holding every stream and value of
// scope sc.
func (s *Store) ScopePrefix(sc string) string { return s.lay.ScopePrefix(sc) }

// Prefix returns the key prefix of the store.
func (s *Store) Prefix() string { return s.lay.prefix }

// ScopeOf returns the scope of a stream or value name.
func (s *Store) ScopeOf(name string) string { return s.lay.scopeOf(name) }

// Stats reports what the store did since Open; Commits counts etcd
// transactions that committed.
func (s *Store) Stats() store.Stats {
	return store.Stats{
		Flushes:   s.flushes.Load(),
		Commits:   s.commits.Load(),
		Appends:   s.appends.Load(),
		CASWrites: s.casWrites.Load(),
	}
}

// SetFence makes every later commit of scope sc compare f. It does not
// reset the scope; a claim that follows a loss calls Reset too.
//
// A new fence (another key or create revision) also ends the need to
// settle the scope: a transaction sent under the old one can no longer
// commit.
func (s *Store) SetFence(sc string, f Fence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.scopeLocked(sc)
	if c.claim != f {
		c.claim, c.fenceMod, c.unsettled = f, f.CreateRevision, false
		// What the store holds was read before this claim: others may
		// have written since, so commits compare it until a reload.
		c.exact = false
		s.dropFilterLocked(c)
	}
	c.fenced = true
}

// Reset forgets everything of scope sc: its sticky error, cached lengths
// and values, and staged writes not yet taken by a commit (a commit in
// progress completes, but its result no longer updates the scope). The
// next use reads the scope from etcd again, after settling it when a
// commit's outcome was unknown (see doc.go). The fence stays. The caller
// makes sure nothing writes sc meanwhile (the participant holds the
// conversation's turn).
func (s *Store) Reset(sc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.scopeLocked(sc)
	c.err = nil
	s.dropFilterLocked(c)
	c.clearLocked()
}

// Drop forgets scope sc entirely (fence included) and makes its calls fail
// with ErrFenced until the next Reset: the owner gave it up.
func (s *Store) Drop(sc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.scopeLocked(sc)
	c.fenced = false
	c.err = fmt.Errorf("%w: %w: scope %q was released", store.ErrFailed, ErrFenced, sc)
	s.dropFilterLocked(c)
	c.clearLocked()
}

// Failed returns the sticky error of scope sc, or nil.
func (s *Store) Failed(sc string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.scopes[sc]; c != nil {
		return c.err
	}
	return nil
}

func (c *scope) clearLocked() {
	c.epoch++
	// Nothing staged survives: the writes counted as staged are gone.
	c.durable = c.staged
	c.loaded = false
	c.exact = false
	c.rev = 0
	c.bytes = make(map[string]*byteValue)
	c.reads = make(map[string]uint64)
	c.streams = make(map[string]*stream)
	c.values = make(map[string]*value)
	c.log = nil
}

func (s *Store) scopeLocked(name string) *scope {
	c := s.scopes[name]
	if c == nil {
		c = &scope{name: name}
		c.clearLocked()
		s.scopes[name] = c
	}
	return c
}

// failLocked makes err the sticky error of c and forgets its state.
func (s *Store) failLocked(c *scope, err error) {
	if c.err == nil {
		c.err = err
		s.log.Warn().Err(err).Str("scope", c.name).Msg("scope failed")
	}
	s.dropFilterLocked(c)
	c.clearLocked()
}

// usableLocked returns the scope of name, or the error that refuses calls
// on it. s.mu must be held.
func (s *Store) usableLocked(name string) (*scope, error) {
	if s.closed {
		return nil, store.ErrClosed
	}
	c := s.scopeLocked(s.lay.scopeOf(name))
	if c.err != nil {
		return nil, c.err
	}
	return c, nil
}

// readableLocked is usableLocked for a read: a fenced scope is loaded
// first (see loadedLocked), so that the scope is settled after a commit of
// unknown outcome and its reads are pinned at its revision. It may release
// and retake s.mu.
func (s *Store) readableLocked(name string) (*scope, error) {
	c, err := s.usableLocked(name)
	if err != nil || !c.fenced {
		return c, err
	}
	return s.loadedLocked(c, name)
}

// commitKV returns the KV a commit transaction goes through: the leader's
// client with leader affinity, else the one given to Open. The caller
// gives the handle and the call's error to s.commitDone.
func (s *Store) commitKV() (clientv3.KV, *pinned) {
	if s.leader == nil {
		return s.kv, nil
	}
	return s.leader.acquire()
}

// commitDone ends a call begun with commitKV.
func (s *Store) commitDone(p *pinned, err error) {
	if s.leader != nil {
		s.leader.release(p, err)
	}
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.opts.Timeout)
}

func checkName(name string) error {
	if name == "" || len(name) > store.MaxNameLen {
		if len(name) > 64 {
			name = name[:64] + "..."
		}
		return fmt.Errorf("%q: %w", name, store.ErrInvalidName)
	}
	return nil
}

// streamLocked returns the state of stream name in c, loading its length
// from etcd first if needed (and the scope, see loadedLocked). It may
// release and retake s.mu; it returns the error that refuses the call if
// the store or scope failed meanwhile.
//
// A stream's length is read once, on its first use since the scope's
// load (loadStream): the end of its last run, one descending range
// limited to one key (a stream without runs has length 0). That knowledge stays valid
// because the store is the scope's only writer (the fence makes it so in
// cluster mode, and any other writer is caught by the compares of the
// next commit), and because nothing of the stream is written before its
// state exists, so no commit of it can be in flight during the read.
func (s *Store) streamLocked(c *scope, name string) (*scope, *stream, error) {
	for {
		if st := c.streams[name]; st != nil {
			return c, st, nil
		}
		c, err := s.loadedLocked(c, name)
		if err != nil {
			return nil, nil, err
		}
		if st := c.streams[name]; st != nil {
			return c, st, nil
		}
		epoch := c.epoch
		s.mu.Unlock()
		n, err := s.loadStream(c.name, name)
		s.mu.Lock()
		if err != nil {
			return nil, nil, err
		}
		if c, err = s.usableLocked(name); err != nil {
			return nil, nil, err
		}
		if c.epoch == epoch && c.loaded && c.streams[name] == nil {
			c.streams[name] = &stream{committed: n}
		}
	}
}

// loadedLocked returns the scope of name loaded (its revision known, and
// whether it is exact), loading it first if needed. It may release and
// retake s.mu, as streamLocked.
//
// A scope whose last commit's outcome is unknown is settled first (see
// settle): what is read afterwards is final, since no transaction sent
// before can commit any more.
func (s *Store) loadedLocked(c *scope, name string) (*scope, error) {
	for !c.loaded {
		if c.fenced && c.inflight != nil {
			// A commit taken before a reset is still in flight: lengths
			// read after now could miss it, and once commits compare the fence
			// alone nothing would catch that. Its outcome comes first (an
			// unknown one leaves the scope to settle).
			ch := s.changed
			s.mu.Unlock()
			s.loadWaits.Add(1)
			<-ch
			s.mu.Lock()
			var err error
			if c, err = s.usableLocked(name); err != nil {
				return nil, err
			}
			continue
		}
		if c.unsettled && c.fenced {
			f := c.claim
			s.mu.Unlock()
			mod, err := s.settle(c.name, f)
			s.mu.Lock()
			if err != nil {
				if errors.Is(err, ErrFenced) && c.claim == f {
					s.failLocked(c, err)
				}
				return nil, err
			}
			if c.claim == f {
				c.fenceMod, c.unsettled = max(c.fenceMod, mod), false
			}
			if c, err = s.usableLocked(name); err != nil {
				return nil, err
			}
			continue
		}
		epoch := c.epoch
		// Nothing of the scope was cached before the load (values read
		// without the claim, say): the scope is then exactly what etcd
		// holds at the load's revision.
		exact := c.fenced && len(c.values) == 0 && len(c.reads) == 0
		claim := c.claim
		s.mu.Unlock()
		// Listed only under the claim: the store is the scope's only
		// writer and sends nothing of it before it is loaded.
		listed := exact && s.opts.MaxFilterBytes > 0
		names, rev, err := s.loadScope(c.name, listed)
		s.mu.Lock()
		if err != nil {
			return nil, err
		}
		c, err = s.usableLocked(name)
		if err != nil {
			return nil, err
		}
		if c.epoch == epoch && !c.loaded {
			c.loaded = true
			c.exact = exact && c.fenced && c.claim == claim && len(c.values) == 0
			c.rev = rev
			if c.exact && listed {
				s.setFilterLocked(c, newKeyFilter(s.filterSeed, names))
			}
		}
	}
	return c, nil
}

// loadScope reads the revision scope sc is loaded at, with one
// linearizable read; with list, that read lists the names of every value
// of the scope (keys only).
func (s *Store) loadScope(sc string, list bool) ([]string, int64, error) {
	if list {
		return s.loadValueNames(sc)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.kv.Get(ctx, s.lay.valueKey(sc, ""), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return nil, 0, fmt.Errorf("etcdstore: load scope %q: %w", sc, err)
	}
	return nil, resp.Header.Revision, nil
}

// loadStream reads the length of stream name of scope sc: the end of its
// last run (its first seq, its key, plus its count), 0 when it has none;
// one descending range limited to one key.
func (s *Store) loadStream(sc, name string) (uint64, error) {
	prefix := s.lay.entryPrefix(sc, name)
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.kv.Get(ctx, prefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("etcdstore: read the length of %q: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	kv := resp.Kvs[0]
	last, err := runSeq(prefix, kv.Key)
	if err != nil {
		return 0, fmt.Errorf("etcdstore: stream %q: %w", name, err)
	}
	count, err := s.runCount(string(kv.Key), kv.Value)
	if err != nil {
		return 0, fmt.Errorf("etcdstore: stream length: %w", err)
	}
	return last + count, nil
}

// get is one range read of gets.
type get struct {
	key  string
	opts []clientv3.OpOption
}

// gets sends reads as one read-only transaction (one round trip, one
// revision), or one by one through a read-only view, which refuses
// transactions.
func (s *Store) gets(reads []get) ([]*clientv3.GetResponse, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	ops := make([]clientv3.Op, len(reads))
	for i, r := range reads {
		ops[i] = clientv3.OpGet(r.key, r.opts...)
	}
	out := make([]*clientv3.GetResponse, len(reads))
	resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, ErrReadOnly) {
		for i, r := range reads {
			if out[i], err = s.kv.Get(ctx, r.key, r.opts...); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != len(reads) {
		return nil, fmt.Errorf("%w: a read of %d ranges answered %d", ErrCorrupt, len(reads), len(resp.Responses))
	}
	for i, r := range resp.Responses {
		rr := r.GetResponseRange()
		if rr == nil {
			return nil, fmt.Errorf("%w: read %d of a transaction answered no range", ErrCorrupt, i)
		}
		out[i] = (*clientv3.GetResponse)(rr)
	}
	return out, nil
}

// Append stages payload at the end of stream; see store.DurableStore.
func (s *Store) Append(name string, payload []byte, expectedSeq uint64) (uint64, error) {
	if err := checkName(name); err != nil {
		return 0, err
	}
	if len(payload) > s.maxPayload {
		return 0, fmt.Errorf("%d bytes, at most %d fit an etcd request: %w", len(payload), s.maxPayload, store.ErrTooLarge)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.usableLocked(name)
	if err != nil {
		return 0, err
	}
	if s.opts.RequireFence && c.name != "" && !c.fenced {
		return 0, fmt.Errorf("%w: %q", ErrNotFenced, c.name)
	}
	c, st, err := s.streamLocked(c, name)
	if err != nil {
		return 0, err
	}
	if n := st.lenLocked(); n != expectedSeq {
		return 0, &store.SequenceConflictError{Stream: name, Expected: expectedSeq, Actual: n}
	}
	st.pending = append(st.pending, append([]byte(nil), payload...))
	c.logAppendLocked(name, st)
	c.staged++
	s.appends.Add(1)
	return expectedSeq, nil
}

// Len returns the length of stream counting staged appends.
func (s *Store) Len(name string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.usableLocked(name)
	if err != nil {
		return 0, err
	}
	_, st, err := s.streamLocked(c, name)
	if err != nil {
		return 0, err
	}
	return st.lenLocked(), nil
}

// ReadFrom returns up to limit entries of stream from offset, staged or
// committed. The entries are copies the caller owns. An offset below the
// stream's first stored entry fails with a *store.CompactedError.
func (s *Store) ReadFrom(name string, offset uint64, limit int) ([]store.Entry, error) {
	return s.ReadPage(name, offset, limit, 0)
}

// CAS stages value key = new if it is old; see store.DurableStore.
func (s *Store) CAS(key string, old, new uint64) error {
	if err := checkName(key); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.usableLocked(key)
	if err != nil {
		return err
	}
	if s.opts.RequireFence && c.name != "" && !c.fenced {
		return fmt.Errorf("%w: %q", ErrNotFenced, c.name)
	}
	for c.values[key] == nil {
		if c.fenced && !c.loaded {
			// A fenced read is pinned at the scope's revision.
			if c, err = s.loadedLocked(c, key); err != nil {
				return err
			}
			continue
		}
		if v, ok := c.reads[key]; ok {
			c.values[key] = &value{committed: v, cur: v}
			break
		}
		if s.absentLocked(c, key) {
			c.values[key] = &value{}
			break
		}
		epoch, readEpoch, pin := c.epoch, c.readEpoch, c.pinLocked()
		s.mu.Unlock()
		v, err := s.loadValue(c.name, key, pin)
		s.mu.Lock()
		if err != nil {
			return err
		}
		if c, err = s.usableLocked(key); err != nil {
			return err
		}
		if c.epoch == epoch && c.readEpoch == readEpoch && c.values[key] == nil {
			c.values[key] = &value{committed: v, cur: v}
		}
	}
	v := c.values[key]
	if v.cur != old {
		return &store.CASConflictError{Key: key, Expected: old, Actual: v.cur}
	}
	v.cur = new
	v.gen++
	c.logLocked(write{name: key, v: v, u64: new, gen: v.gen})
	c.staged++
	delete(c.reads, key)
	s.casWrites.Add(1)
	return nil
}

// pinLocked returns the revision a read of c is pinned at: c's revision
// when c is fenced (loaded), else 0 for a linearizable read.
func (c *scope) pinLocked() int64 {
	if !c.fenced {
		return 0
	}
	return c.rev
}

// loadValue reads value key of scope sc from etcd: at revision pin when pin
// is not 0, else linearizably.
//
// A fenced scope's reads are pinned at its revision, which covers what the
// store committed and what it loaded after its claim: the store is the
// scope's only writer, so the value there is the current one, and a read
// must never see less, because the participant decides on it without a
// commit (a token's index entry absent: decided as new). The read is
// serializable and batched with the reads beside it (read.go): a member
// that has applied pin answers it without a round through the leader,
// and one that has not (lagging, cut off from its peers) refuses it as a
// future revision instead of answering stale data.
func (s *Store) loadValue(sc, key string, pin int64) (uint64, error) {
	if pin != 0 {
		return s.readBatched(s.lay.valueKey(sc, key), pin)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	k := s.lay.valueKey(sc, key)
	resp, err := s.kv.Get(ctx, k)
	if err != nil {
		return 0, fmt.Errorf("etcdstore: read value %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return s.unsealU64(k, resp.Kvs[0].Value)
}

// ReadValue returns the current value of key, 0 when absent.
func (s *Store) ReadValue(key string) (uint64, error) {
	s.mu.Lock()
	c, err := s.readableLocked(key)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	if v := c.values[key]; v != nil {
		s.mu.Unlock()
		return v.cur, nil
	}
	if v, ok := c.reads[key]; ok {
		s.mu.Unlock()
		return v, nil
	}
	if s.absentLocked(c, key) {
		s.mu.Unlock()
		return 0, nil
	}
	epoch, readEpoch, pin := c.epoch, c.readEpoch, c.pinLocked()
	s.mu.Unlock()
	v, err := s.loadValue(c.name, key, pin)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, err = s.usableLocked(key); err != nil {
		return 0, err
	}
	if w := c.values[key]; w != nil {
		return w.cur, nil
	}
	if c.epoch == epoch && c.readEpoch == readEpoch {
		c.reads[key] = v
	}
	return v, nil
}

// Scan returns every value whose name starts with prefix, in name order.
// Names map to scopes by a function, not by prefix, so Scan reads the
// prefix's values in one scope's key range when Options.ScanScope reports
// that every name of prefix has prefix's scope, and otherwise walks the
// keys of every scope (for offline tools, not for serving).
func (s *Store) Scan(prefix string) ([]store.Value, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, store.ErrClosed
	}
	s.mu.Unlock()
	found := make(map[string]uint64)
	// The walk lists keys only (the range holds every stream's entries)
	// and reads each value; a range of one scope's values reads them with
	// the range.
	from, end := s.lay.prefix, clientv3.GetPrefixRangeEnd(s.lay.prefix)
	keysOnly := true
	if s.opts.ScanScope != nil && s.opts.ScanScope(prefix) {
		from = s.lay.valueKey(s.lay.scopeOf(prefix), prefix)
		end = clientv3.GetPrefixRangeEnd(from)
		keysOnly = false
	}
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(1024)}
		if keysOnly {
			opts = append(opts, clientv3.WithKeysOnly())
		}
		ctx, cancel := s.ctx()
		resp, err := s.kv.Get(ctx, from, opts...)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("etcdstore: scan: %w", err)
		}
		for _, kv := range resp.Kvs {
			name, ok := s.lay.valueName(string(kv.Key))
			if !ok || !strings.HasPrefix(name, prefix) || s.lay.valueKey(s.lay.scopeOf(name), name) != string(kv.Key) {
				continue
			}
			var v uint64
			if keysOnly {
				if v, err = s.loadValue(s.lay.scopeOf(name), name, 0); err != nil {
					return nil, err
				}
			} else if v, err = s.unsealU64(string(kv.Key), kv.Value); err != nil {
				return nil, err
			}
			found[name] = v
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	s.mu.Lock()
	for _, c := range s.scopes {
		for name, v := range c.values {
			if strings.HasPrefix(name, prefix) {
				found[name] = v.cur
			}
		}
	}
	s.mu.Unlock()
	out := make([]store.Value, 0, len(found))
	for k, v := range found {
		if v != 0 {
			out = append(out, store.Value{Key: k, Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Flush returns nil only when every write that returned before the call is
// durable in etcd; it reports the sticky error of any failed scope, so after
// one failure it fails until that scope is Reset (FlushScopes does not).
func (s *Store) Flush() error {
	return s.flush(nil)
}

// FlushScopes is Flush for the writes of the named scopes only: it returns
// nil once every write of those scopes staged before the call is durable
// (their commits may carry other scopes along), and its error reports only
// those scopes, so a scope fenced off elsewhere fails only its own flushes.
func (s *Store) FlushScopes(scopes ...string) error {
	if scopes == nil {
		scopes = []string{}
	}
	return s.flush(scopes)
}

func (s *Store) flush(names []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	s.flushes.Add(1)
	var scopes []*scope
	if names == nil {
		for _, c := range s.scopes {
			if c.err != nil || c.pending() {
				scopes = append(scopes, c)
			}
		}
	} else {
		for _, n := range names {
			scopes = append(scopes, s.scopeLocked(n))
		}
	}
	// The writes of each scope staged so far must become durable; a reset
	// or failure of the scope (a new epoch) ends the wait.
	type target struct {
		c      *scope
		staged uint64
		epoch  uint64
	}
	targets := make([]target, 0, len(scopes))
	kick := false
	for _, c := range scopes {
		if c.err != nil {
			return c.err
		}
		if c.pending() {
			targets = append(targets, target{c, c.staged, c.epoch})
			if c.dirty() {
				c.wanted = true
				kick = kick || c.inflight == nil
			}
		}
	}
	if kick {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	for {
		waiting := false
		for _, t := range targets {
			switch {
			case t.c.err != nil:
				return t.c.err
			case t.c.epoch != t.epoch:
				return fmt.Errorf("%w: %w: scope %q was reset while flushing", store.ErrFailed, ErrFenced, t.c.name)
			case t.c.durable < t.staged:
				waiting = true
			}
		}
		if !waiting {
			return nil
		}
		if s.closed {
			return store.ErrClosed
		}
		ch := s.changed
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
}

// Close stops the committer. Writes not yet committed are discarded, as in
// a crash; commits in progress complete first. Every later call returns
// store.ErrClosed, and so do Flushes still waiting.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	close(s.quit)
	<-s.done
	if s.leader != nil {
		s.leader.stop()
	}
	s.mu.Lock()
	s.broadcastLocked()
	s.mu.Unlock()
	return nil
}

// broadcastLocked wakes every waiting Flush.
func (s *Store) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

var _ store.DurableStore = (*Store)(nil)
