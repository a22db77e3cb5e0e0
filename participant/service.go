package participant

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/fence"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
)

// IncarnationKey is the durable server incarnation, one more at every
// Open: the store's one key outside the conversations and the registry
// (package registry).
const IncarnationKey = "server/incarnation"

// Defaults for the zero Options.
const (
	DefaultReceiptTTL              = 24 * time.Hour
	DefaultMaxRecordBytes          = 512 << 10
	DefaultMaxParticipants         = 1024
	DefaultMaxConversationsPerConn = 1024
	DefaultMaxConversations        = 1_000_000
	DefaultMaxBacklogBytes         = 16 << 20
	DefaultBacklogWindowBytes      = 1 << 20
	DefaultReadPageBytes           = 1 << 20
	DefaultLoadBytes               = 64 << 20
	DefaultCheckpointInterval      = 10 * time.Second
	DefaultCheckpointRows          = 4096
	DefaultCheckpointPassRows      = 1 << 16
	DefaultRetain                  = 7 * 24 * time.Hour
	DefaultTokenSkew               = time.Minute
)

// Options configures a Service. The zero value is valid except for NodeKey.
type Options struct {
	// NodeKey derives every attach secret (see LoadOrCreateNodeKey); it
	// must be NodeKeySize bytes and stay the same for the life of the data.
	NodeKey []byte
	// ReceiptTTL is how long the secret-bearing answer of enroll and attach
	// is replayed. Default DefaultReceiptTTL.
	ReceiptTTL time.Duration
	// MaxRecordBytes is the largest tell payload. Default
	// DefaultMaxRecordBytes.
	MaxRecordBytes int
	// MaxParticipants caps participants per conversation.
	MaxParticipants int
	// MaxConversationsPerConn caps the bindings one connection holds.
	MaxConversationsPerConn int
	// EnrollPolicy says who may enroll. Default EnrollOpen.
	EnrollPolicy EnrollPolicy
	// MaxConversations caps the conversations of the store: the first
	// enroll of one more is capacity_exceeded. Default
	// DefaultMaxConversations.
	MaxConversations int
	// MaxDataBytes caps the store's size as DataBytes reports it: once it
	// is reached, enroll and tell (the operations that add data) are
	// capacity_exceeded; the others, which end or advance what exists,
	// still commit. Zero, or a nil DataBytes, means no cap.
	MaxDataBytes int64
	// DataBytes reports the store's size in bytes; it is called for each
	// enroll and tell, and must be cheap and safe for concurrent use.
	DataBytes func() int64
	// RestoredFrom names the backup the data was restored from (the
	// server reads it from the data directory's restore marker), for the
	// refusal of a credential newer than the data; "" when not known.
	RestoredFrom string
	// MaxBacklogBytes bounds the payload bytes of unacknowledged records
	// that all conversations together keep in memory. Past it, the oldest
	// payloads of the conversations holding the most are dropped from
	// memory and read back from the oplog when their recipient catches up
	// (see backlog.go). Default DefaultMaxBacklogBytes.
	MaxBacklogBytes int64
	// BacklogWindowBytes bounds the payload bytes one conversation keeps
	// in memory for its recipients: past it, the conversation's oldest
	// payloads are dropped from memory at its own commit, and read back
	// from the oplog when delivered. A recipient that never reads thus
	// costs its window, not a share of the service's budget that grows
	// with what it is sent (see backlog.go). Default
	// DefaultBacklogWindowBytes, and never more than MaxBacklogBytes.
	BacklogWindowBytes int64
	// MaxBacklogRecords caps the records one conversation retains until
	// every recipient acknowledged them (or left): past it, enroll, tell
	// and attach are backlog_full (see backpressure.go). Default
	// DefaultMaxBacklogRecords.
	MaxBacklogRecords int
	// BacklogRecords is the budget of retained records of all
	// conversations together: past it, a conversation holding its share
	// of it or more is backlog_full. Default DefaultBacklogRecords.
	BacklogRecords int
	// ClientShare is the percentage of BacklogRecords and of
	// MaxConversations that the conversations charged to one Principal
	// may take (see share.go). Default DefaultClientShare; 100 turns the
	// shares off.
	ClientShare int
	// LoadWorkers is how many conversations Open reconciles at once.
	// Default 64: reconciliations that must commit share group commits.
	LoadWorkers int
	// ReadPageBytes bounds a page of a stream that reconciliation reads
	// (a page holds at least one row, so it is raised to fit the largest
	// row MaxRecordBytes allows). Default DefaultReadPageBytes.
	ReadPageBytes int
	// LoadBytes bounds the pages every reconciliation in progress holds
	// at once; each holds two. Default DefaultLoadBytes.
	LoadBytes int
	// CheckpointInterval is how often the background checkpointer runs a
	// CheckpointPass; zero or negative runs none (the daemon runs one
	// every DefaultCheckpointInterval unless told otherwise). Checkpoints
	// need a store.Compactor.
	CheckpointInterval time.Duration
	// CheckpointRows is how many rows past its checkpoint a conversation
	// must be for a pass to write a new one. Default DefaultCheckpointRows.
	CheckpointRows int
	// CheckpointPassRows bounds the oplog rows one pass reads. Default
	// DefaultCheckpointPassRows.
	CheckpointPassRows int
	// Retain is how long history stays after the acknowledgement that
	// settled it (docs/DESIGN.md, Data lifecycle). Default DefaultRetain.
	Retain time.Duration
	// TokenWindow, when positive, bounds deduplication in time
	// (docs/DESIGN.md, The token window): every token must be a UUIDv7,
	// whose first 48 bits are the unix ms it was drawn at; a token older
	// than the window that is not found committed is refused
	// token_expired instead of committing, so compaction may forget the
	// tokens older than it and disk stays bounded. Zero (the default)
	// keeps every token's answer forever.
	TokenWindow time.Duration
	// MaxUnackedAge bounds how long a record waits for its recipients'
	// acknowledgements: each compaction pass gives up (releases) the
	// records that committed longer ago, acknowledged or not, and a
	// recipient that had not acknowledged one gets the compacted notice
	// before its next delivery (docs/DESIGN.md, Compaction). Their rows
	// go after Retain, like settled history. Zero (the default) waits
	// forever.
	MaxUnackedAge time.Duration
	// TokenSkew is how far ahead of the server's clock a token's time may
	// be under a token window. Default DefaultTokenSkew.
	TokenSkew time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger receives the service's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// Observer, if set, is told about every operation.
	Observer Observer
	// Ownership decides which conversations this service serves; nil
	// means a single node that owns them all (see ownership.go).
	Ownership Ownership
	// PrefetchTokens makes a batch read the token index entries of all its
	// token-bearing operations at once, concurrently, before deciding
	// them, instead of one after another as each is decided (tokens.go).
	// It pays where a store read is a network round trip and the store
	// shares concurrent reads (the etcd store of cluster mode); over a
	// local store the reads are cheap and the goroutines cost more than
	// they save. Default off.
	PrefetchTokens bool
	// NoPipeline keeps every batch's turn until its commit is durable,
	// instead of handing it to the conversation's next batch once its
	// rows are appended (pipeline.go). For measuring what pipelining is
	// worth, and for tests that need the old order. Default off.
	NoPipeline bool
	// TracerProvider, if set, traces each batch and its barriers as spans
	// linked to the spans of the requests it carries (trace.go); nil
	// traces nothing, at the cost of one nil check per batch.
	TracerProvider trace.TracerProvider
}

// Observer receives one call per finished operation, for metrics. Calls come
// from many goroutines and must not block.
type Observer interface {
	// Operation reports an operation of kind op ("enroll", "tell", …,
	// "end") that finished with outcome ("ok", "replay", "noop" or an error
	// code) after d.
	Operation(op string, outcome string, d time.Duration)
}

func (o *Options) withDefaults() {
	if o.ReceiptTTL <= 0 {
		o.ReceiptTTL = DefaultReceiptTTL
	}
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if o.MaxParticipants <= 0 {
		o.MaxParticipants = DefaultMaxParticipants
	}
	if o.MaxConversationsPerConn <= 0 {
		o.MaxConversationsPerConn = DefaultMaxConversationsPerConn
	}
	if o.EnrollPolicy == "" {
		o.EnrollPolicy = EnrollOpen
	}
	if o.MaxConversations <= 0 {
		o.MaxConversations = DefaultMaxConversations
	}
	if o.MaxBacklogBytes <= 0 {
		o.MaxBacklogBytes = DefaultMaxBacklogBytes
	}
	if o.BacklogWindowBytes <= 0 {
		o.BacklogWindowBytes = DefaultBacklogWindowBytes
	}
	o.BacklogWindowBytes = min(o.BacklogWindowBytes, o.MaxBacklogBytes)
	if o.MaxBacklogRecords <= 0 {
		o.MaxBacklogRecords = DefaultMaxBacklogRecords
	}
	if o.BacklogRecords <= 0 {
		o.BacklogRecords = DefaultBacklogRecords
	}
	if o.ClientShare <= 0 {
		o.ClientShare = DefaultClientShare
	}
	o.ClientShare = min(o.ClientShare, 100)
	if o.LoadWorkers <= 0 {
		o.LoadWorkers = max(64, runtime.GOMAXPROCS(0))
	}
	if o.ReadPageBytes <= 0 {
		o.ReadPageBytes = DefaultReadPageBytes
	}
	// A row carries at most one payload and a few dozen bytes besides.
	o.ReadPageBytes = max(o.ReadPageBytes, o.MaxRecordBytes+4<<10)
	if o.LoadBytes <= 0 {
		o.LoadBytes = DefaultLoadBytes
	}
	if o.CheckpointRows <= 0 {
		o.CheckpointRows = DefaultCheckpointRows
	}
	if o.CheckpointPassRows <= 0 {
		o.CheckpointPassRows = DefaultCheckpointPassRows
	}
	if o.Retain <= 0 {
		o.Retain = DefaultRetain
	}
	if o.TokenSkew <= 0 {
		o.TokenSkew = DefaultTokenSkew
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

func (o *Options) backlogLimits() backlogLimits {
	return backlogLimits{conversation: int64(o.MaxBacklogRecords), budget: int64(o.BacklogRecords)}
}

// site is a fencing site: one participant of one conversation. Each of its
// bindings is one generation of the site.
type site struct {
	conv ConversationID
	p    ParticipantID
}

// Service is the participant service: every operation of the protocol over
// one DurableStore, with two-barrier commits, replays, reconciliation and
// publication. It is safe for concurrent use.
type Service struct {
	st   store.DurableStore
	opts Options
	// own is opts.Ownership, or the single-node one (ownershipOf).
	own Ownership
	// pipelined counts the batches decided while the one before them was
	// in flight (pipeline.go).
	pipelined atomic.Uint64
	// idleTurns counts the turns a waiter took with nothing queued (see
	// await): a waiter whose operation a batch already took takes none.
	idleTurns   atomic.Uint64
	log         zerolog.Logger
	incarnation uint64
	fences      *fence.Fences[site]
	// failure is set once the store failed for good (see failed.go).
	failure storeFailure
	// conversationSlots counts conversations against MaxConversations.
	conversationSlots slots
	backlog           *backlog
	// shareLimits bound what one principal is charged with (share.go).
	shareLimits shareLimits
	// pages bounds what reconciliations read at once (see reconcile).
	pages pages
	// tracer traces batches and barriers (trace.go); nil when tracing
	// is off.
	tracer trace.Tracer
	// rebindHook, when set, is called by rebindTurn with the
	// conversation's id once it has sorted the bindings a load found and
	// before it publishes them, so that a test acts there. Nil but in
	// tests.
	rebindHook atomic.Pointer[func(ConversationID)]

	// regMu serializes appends to the registry stream.
	regMu sync.Mutex

	// mu guards the fields below. It is never held across I/O or while
	// taking a conversation's lock.
	mu sync.Mutex
	// +checklocks:mu
	convs map[ConversationID]*conversation
	// +checklocks:mu
	conns map[ConnID]*Conn
	// shares holds the account of every principal with a connection or
	// a conversation charged to it (share.go).
	// +checklocks:mu
	shares map[uint64]*share
	// +checklocks:mu
	nextOrdinal uint64
	// +checklocks:mu
	draining bool
	// +checklocks:mu
	closed bool

	// ctx lives until Close; bg counts the reloads it runs in the
	// background, which Close waits for.
	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup
	// lifecycle counts the background checkpointer (checkpointer.go),
	// which runs until ctx ends; Close waits for it.
	lifecycle sync.WaitGroup

	// passes counts what the checkpoint and compaction passes did
	// (stats.go).
	passes passStats
}

// Open starts the service on st: it advances the durable server incarnation,
// reads the registry, and reconciles every conversation before returning, so
// nothing is published before it is reconciled. Bindings left by the
// previous incarnation end as died/unclean_restart, through the normal two
// barriers. A conversation that fails reconciliation is contained (see
// Unloadable); an unreadable registry, a store that cannot record the
// incarnation, or a store that fails (store.ErrFailed) while reconciling,
// fails Open.
//
// The caller keeps ownership of st and closes it after Close.
func Open(ctx context.Context, st store.DurableStore, opts Options) (*Service, error) {
	opts.withDefaults()
	if len(opts.NodeKey) != NodeKeySize {
		return nil, fmt.Errorf("participant: node key has %d bytes, want %d", len(opts.NodeKey), NodeKeySize)
	}
	if _, err := ParseEnrollPolicy(string(opts.EnrollPolicy)); err != nil {
		return nil, err
	}
	s := &Service{
		st:      st,
		opts:    opts,
		own:     ownershipOf(&opts, st),
		log:     opts.Logger.With().Str("component", "participant").Logger(),
		tracer:  newTracer(opts.TracerProvider),
		fences:  fence.New[site](fence.Options{}),
		failure: newStoreFailure(),
		convs:   make(map[ConversationID]*conversation),
		conns:   make(map[ConnID]*Conn),
		shares:  make(map[uint64]*share),
		pages:   pages{budget: newByteBudget(int64(opts.LoadBytes)), bytes: opts.ReadPageBytes, window: opts.BacklogWindowBytes},
	}
	s.backlog = newBacklog(opts.MaxBacklogBytes, opts.BacklogWindowBytes, opts.backlogLimits())
	s.shareLimits = opts.shareLimits()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	inc, err := st.ReadValue(IncarnationKey)
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("participant: read incarnation: %w", err)
	}
	if err := st.CAS(IncarnationKey, inc, inc+1); err != nil {
		return nil, fmt.Errorf("participant: advance incarnation: %w", err)
	}
	// The incarnation must be durable before any binding carries it, or a
	// crash could hand two processes' connections the same identity.
	if err := st.Flush(); err != nil {
		return nil, fmt.Errorf("participant: advance incarnation: %w", err)
	}
	s.incarnation = inc + 1
	ids, err := readRegistry(st)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	for _, id := range ids {
		s.convs[id] = s.newConversation(id, true)
	}
	s.mu.Unlock()
	s.conversationSlots = slots{max: opts.MaxConversations, n: len(ids)}
	if err := s.loadAll(ctx, ids); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.Failed(); err != nil {
		s.Close()
		return nil, fmt.Errorf("participant: reconcile: %w", err)
	}
	s.log.Info().Uint64("incarnation", s.incarnation).Int("conversations", len(ids)).
		Int("unloadable", len(s.Unloadable())).Msg("reconciled")
	if _, ok := store.AsCompactor(st); ok && opts.CheckpointInterval > 0 {
		s.lifecycle.Add(1)
		go func() {
			defer s.lifecycle.Done()
			s.runCheckpoints(s.ctx)
		}()
	}
	return s, nil
}

// readRegistry returns every registered conversation once, in registration
// order. An entry that does not decode fails it: skipping it would leave
// a conversation that exists unloaded.
func readRegistry(st store.DurableStore) ([]ConversationID, error) {
	entries, err := st.ReadFrom(registry.Stream, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("participant: read registry: %w", err)
	}
	seen := make(map[ConversationID]bool, len(entries))
	ids := make([]ConversationID, 0, len(entries))
	for _, e := range entries {
		en, err := registry.Decode(e.Payload)
		if err != nil {
			return nil, fmt.Errorf("participant: registry entry %d: %w", e.Seq, err)
		}
		if !seen[en.Conversation] {
			seen[en.Conversation] = true
			ids = append(ids, en.Conversation)
		}
	}
	return ids, nil
}

// loadAll reconciles conversations with LoadWorkers goroutines, so that the
// commits reconciliation makes (repairs, unclean-restart endings) share
// group commits.
func (s *Service) loadAll(ctx context.Context, ids []ConversationID) error {
	work := make(chan ConversationID)
	var wg sync.WaitGroup
	for range min(s.opts.LoadWorkers, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				cv := s.conversation(id)
				if err := cv.acquire(ctx); err != nil {
					continue
				}
				_, err := s.ensureLoadedTurn(ctx, cv)
				s.noteStoreErr(err)
				if err != nil && !cv.contained() && !cv.deleted.Load() {
					// Contained conversations were logged when refused; a
					// storage failure leaves the conversation for its next
					// touch to load.
					s.log.Warn().Err(err).Uint64("conversation", uint64(id)).Msg("conversation not loaded at start")
				}
				s.release(cv)
			}
		}()
	}
	var err error
	for _, id := range ids {
		select {
		case work <- id:
			continue
		case <-ctx.Done():
			err = ctx.Err()
		}
		break
	}
	close(work)
	wg.Wait()
	return err
}

// Incarnation returns the server incarnation of this process.
func (s *Service) Incarnation() uint64 { return s.incarnation }

// Options returns the effective options (defaults applied).
func (s *Service) Options() Options { return s.opts }

// Unloadable lists the contained conversations, in no particular order.
func (s *Service) Unloadable() []Unloadable {
	convs := s.conversations()
	var out []Unloadable
	for _, cv := range convs {
		cv.mu.RLock()
		if cv.unloadable != nil {
			out = append(out, *cv.unloadable)
		}
		cv.mu.RUnlock()
	}
	return out
}

// Drain makes every later operation answer shutting_down. The caller then
// ends each connection with CauseShutdown.
func (s *Service) Drain() {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
}

func (s *Service) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// Connect registers a new connection that acts for nobody (see
// ConnectAs).
func (s *Service) Connect(wake func()) *Conn { return s.ConnectAs("", wake) }

// ConnectAs registers a new connection acting for principal p, whose
// conversations are held to p's share of the service-wide budgets (see
// share.go), and returns its handle. wake is called (without locks held,
// from the committing goroutine) whenever the connection's inbox of ready
// conversations goes from empty to non-empty; it must not block.
func (s *Service) ConnectAs(p Principal, wake func()) *Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.shareLocked(p)
	s.nextOrdinal++
	c := &Conn{
		svc:      s,
		id:       ConnID{Server: s.incarnation, Ordinal: s.nextOrdinal},
		share:    sh,
		wake:     wake,
		ready:    make(map[ConversationID]struct{}),
		bindings: make(map[ConversationID]ParticipantID),
	}
	s.conns[c.id] = c
	return c
}

func (s *Service) conn(id ConnID) *Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[id]
}

// conversation returns the entry of id, creating an unregistered one.
func (s *Service) conversation(id ConversationID) *conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	cv := s.convs[id]
	if cv == nil {
		cv = s.newConversation(id, false)
		s.convs[id] = cv
	}
	return cv
}

// pin returns the entry of id, creating an unregistered one, and counts
// one more operation on it; unpin undoes it. Only pinned entries stay in
// the map unregistered, so a refused enroll leaves nothing behind.
func (s *Service) pin(id ConversationID) *conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	cv := s.convs[id]
	if cv == nil {
		cv = s.newConversation(id, false)
		s.convs[id] = cv
	}
	cv.pins++
	return cv
}

// pinExisting pins the entry of id if there is one; nil if not.
func (s *Service) pinExisting(id ConversationID) *conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	cv := s.convs[id]
	if cv != nil {
		cv.pins++
	}
	return cv
}

// unpin ends a pin of cv once its operation is answered. The last pin of a
// conversation that nothing registered forgets the entry: nothing of it is
// stored and no operation on it is queued. A pinned operation's batch
// writes registered before the operation is answered, so its own unpin
// sees it; a background reload pins the entry for as long as it holds the
// turn (release). So no entry is forgotten while anything that might
// register it holds it: a forgotten entry's fresh ownership grant would
// give one conversation two entries and two turns.
func (s *Service) unpin(cv *conversation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cv.pins--
	if cv.pins == 0 && (!cv.registered.Load() || cv.deleted.Load()) && s.convs[cv.id] == cv {
		delete(s.convs, cv.id)
		cv.uncharge()
		cv.settleParked() // nothing of it is stored, or no binding is left
	}
}

// existing returns the entry of id, or nil.
func (s *Service) existing(id ConversationID) *conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.convs[id]
}

// conversations returns the conversations memory holds, in no particular
// order; the slice is the caller's.
func (s *Service) conversations() []*conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	convs := make([]*conversation, 0, len(s.convs))
	for _, cv := range s.convs {
		convs = append(convs, cv)
	}
	return convs
}

func (s *Service) now() time.Time { return s.opts.Now() }

// observe reports a finished operation. It is deferred with the address
// of the operation's named error result, so it sees the final error;
// succeeded is the outcome of a success, "" for "ok" (answer.outcome).
func (s *Service) observe(op string, start time.Time, errp *error, succeeded string) {
	if s.opts.Observer == nil {
		return
	}
	outcome := "ok"
	var pe *Error
	switch err := *errp; {
	case errors.As(err, &pe):
		outcome = string(pe.Code)
	case err != nil:
		outcome = "error"
	case succeeded != "":
		outcome = succeeded
	}
	s.opts.Observer.Operation(op, outcome, time.Since(start))
}

// Close stops the service and waits for its background reloads. It does
// not end bindings (a drain does that) and does not close the store. A
// second Close does nothing more.
func (s *Service) Close() error {
	s.mu.Lock()
	s.draining, s.closed = true, true
	s.mu.Unlock()
	s.cancel()
	s.bg.Wait()
	s.lifecycle.Wait()
	return nil
}

// release gives up cv's turn, then brings the backlog back within its
// budget if a commit took it past (see backlog). When the turn's holder dropped the
// conversation's state, a reload starts at once in the background, so that
// connections waiting for its records need not wait for the next operation
// on it; it publishes what it finds. The reload is counted (Service.bg)
// before the turn is given up, so that whoever takes the turn next sees it.
func (s *Service) release(cv *conversation) {
	reload := cv.dropped && s.pinForReload(cv)
	cv.dropped = false
	<-cv.turn
	s.trimBacklog()
	if reload {
		go s.reload(cv)
	}
}

// reload loads cv again after a failed commit dropped its state, and
// publishes what it finds; cv was pinned and counted for it
// (pinForReload).
func (s *Service) reload(cv *conversation) {
	defer s.bg.Done()
	defer s.unpin(cv)
	if err := cv.acquire(s.ctx); err != nil {
		return
	}
	// A failure leaves the conversation dropped; the next touch
	// retries, so the background reload never loops on a failing store.
	if _, err := s.ensureLoadedTurn(s.ctx, cv); err != nil {
		s.noteStoreErr(err)
		s.log.Warn().Err(err).Uint64("conversation", uint64(cv.id)).Msg("reload after a failed commit did not complete")
	}
	cv.dropped = false
	<-cv.turn
}

// pinForReload pins cv for a background reload, as an operation does, and
// counts the reload, reporting false when cv needs none: an entry that no
// operation pins and nothing registered would otherwise be forgotten
// (unpin) while the reload holds its turn and perhaps registers it, and
// an entry already forgotten has nobody waiting for it.
func (s *Service) pinForReload(cv *conversation) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.convs[cv.id] != cv {
		return false
	}
	cv.pins++
	s.bg.Add(1)
	return true
}

// conversation is one conversation's entry. Operations on it queue, and the
// holder of its turn decides and commits them in batches; publication reads
// its state under mu.
type conversation struct {
	id ConversationID
	// turn is a one-slot semaphore held by the batch in progress (or a
	// reload), across its barriers. The two fields below are used only by
	// its holder; the state under mu is written only by its holder.
	turn chan struct{}
	// registered is set once the registry entry is appended, where the
	// store keeps its order with the genesis row or barrier 1 makes both
	// durable (the row is never durable without it); once the entry is
	// durable, where neither holds (batch.write flushes it first: an
	// entry whose flush failed is registered again); or when a fresh
	// ownership grant says it may exist. Written by the turn holder only;
	// atomic because unpin reads it without the turn, while a background
	// reload (release) may hold it.
	registered atomic.Bool
	// deleted is set once the conversation is known deleted (delete.go):
	// its entry leaves the map at its last unpin. Written by the turn
	// holder; read by unpin.
	deleted atomic.Bool
	// counted is set while the conversation holds one of the service's
	// MaxConversations slots (slots): from the start that found it
	// registered, the commit of its genesis here, or the load that found
	// it stored (another node created it), until it is deleted. Turn
	// holder only.
	counted bool
	// chargeStored is set once the store holds the conversation's charge
	// (share.go, chargeKey): read at its load, or written by a commit.
	// Turn holder only.
	chargeStored bool
	dropped      bool
	// resets counts forgetLocked calls. heldAt is its value when the
	// turn's holder began to use the conversation (ensureLoadedTurn):
	// once they differ, the conversation was forgotten under the holder
	// (Forget, its ownership lost), and the holder installs nothing more
	// (current). Turn holder only.
	resets atomic.Uint64
	heldAt uint64
	// pins counts the queued or running operations that may create the
	// conversation; guarded by Service.mu. See Service.pin.
	pins int
	// share is the account the conversation is charged to, nil while
	// none (share.go). Set by the turn holder under mu, once.
	share atomic.Pointer[share]

	// qmu guards queue, the operations waiting for the turn, in order.
	qmu sync.Mutex
	// +checklocks:qmu
	queue []*task

	// mu guards state, unloadable and bindingTokens. Readers hold it only
	// briefly; the turn holder takes it to publish a batch.
	mu sync.RWMutex
	// state is the reconciled conversation, nil while not loaded: never
	// loaded, dropped after a failed commit, or unloadable.
	// +checklocks:mu
	state *outbox.State
	// unloadable is set when reconciliation refused the conversation.
	// +checklocks:mu
	unloadable *Unloadable
	// bindingTokens holds the fence token of each bound participant.
	// +checklocks:mu
	bindingTokens map[ParticipantID]fenceToken
	// parked holds the binding slots of enrolls and attaches whose
	// bindings may be stored but were not published: in doubt, or
	// committed under a Forget. Each stays reserved on its connection
	// until the next load of the conversation settles it: taken over by
	// the binding the load finds (rebindTurn), or given back (settleParked);
	// a Forget, the conversation's containment (contain) or the end of its
	// connection (Conn.End) gives it back first.
	// +checklocks:mu
	parked []*bindingSlot
	// lost counts the times this service learned it lost the right to
	// serve the conversation (Forget, an Acquire answered moved), each of
	// which gave its parked slots back (disownLocked); lostAt is its
	// value when the turn's holder began to use the conversation
	// (ensureLoadedTurn), so that a slot its batch would park after a
	// Forget is given back instead (park). lostAt: turn holder only.
	// +checklocks:mu
	lost   uint64
	lostAt uint64
	// lastRow caches when the state's last row committed, for the
	// deletion pass (delete.go): read once per Applied, not every pass.
	// +checklocks:mu
	lastRow committedRow
	// deleteRetry is set while the deletion pass failed on the
	// conversation (a read, its Delete row's commit, or its purge): the
	// next pass takes its turn although it may not be loaded, so that its
	// load finishes the purge or reads back what a failed commit dropped
	// (delete.go).
	deleteRetry atomic.Bool
	// retry holds, per step of the background passes, the backoff after
	// the step failed on this conversation alone (passretry.go).
	retry [numSteps]stepRetry

	// backlog is the service's in-memory backlog account; set once.
	backlog *backlog // +checklocksignore: read-only, not guarded by mu

	// tokenFloor is the token window's persisted floor (windowKey), as
	// read when resets was tokenFloorAt-1 (0: not read). Turn holder only.
	tokenFloor   int64
	tokenFloorAt uint64

	// inflight is the last batch that handed the turn on before its
	// commit was durable (pipeline.go); nil, or done, when none is in
	// flight. Turn holder only.
	inflight *batch
}

func (s *Service) newConversation(id ConversationID, registered bool) *conversation {
	cv := &conversation{id: id, turn: make(chan struct{}, 1), backlog: s.backlog}
	cv.registered.Store(registered)
	cv.counted = registered
	return cv
}

// acquire takes cv's turn once no batch is in flight: the holder may
// rely on nothing of cv being written but by itself (see drain).
func (cv *conversation) acquire(ctx context.Context) error {
	select {
	case cv.turn <- struct{}{}:
	case <-ctx.Done():
		return &Error{Code: CodeUnavailable, Detail: "waiting for the conversation", cause: ctx.Err()}
	}
	if err := cv.drain(ctx); err != nil {
		<-cv.turn
		return err
	}
	return nil
}

// loaded returns the state pointer under the read lock. Only the turn
// holder may use the returned state without the lock.
func (cv *conversation) loaded() *outbox.State {
	cv.mu.RLock()
	defer cv.mu.RUnlock()
	return cv.state
}

// contained reports whether reconciliation refused the conversation.
func (cv *conversation) contained() bool {
	cv.mu.RLock()
	defer cv.mu.RUnlock()
	return cv.unloadable != nil
}

// drop forgets the in-memory state after a failed commit; the next touch
// reconciles the conversation from its streams.
func (cv *conversation) drop() {
	cv.dropped = true
	cv.mu.Lock()
	cv.forgetLocked()
	cv.mu.Unlock()
}

// forgetLocked drops what memory holds of the conversation; cv.mu is held.
// resets counts it, so that work begun before without the turn (a
// compaction's receipts, staged in a store scope that the same event may
// have reset) can tell before it relies on that work.
//
// +checklocks:cv.mu
func (cv *conversation) forgetLocked() {
	cv.setStateLocked(nil)
	cv.bindingTokens = nil
	cv.resets.Add(1)
}

// currentLocked reports whether nothing forgot the conversation since its
// turn's holder began to use it, so that the holder may install state;
// cv.mu is held. Forget does not wait for the turn (the keep-alive that
// calls it must not wait on a commit in flight): a holder whose batch or
// reconciliation was overtaken by it finds it here, and leaves the
// conversation forgotten.
//
// +checklocksread:cv.mu
func (cv *conversation) currentLocked() bool { return cv.resets.Load() == cv.heldAt }

// fenceToken is the fence token of one binding.
type fenceToken = fence.Token
