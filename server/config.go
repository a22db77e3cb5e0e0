package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/internal/buildinfo"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// Defaults of the zero Config.
const (
	DefaultDataDir              = "data"
	DefaultListen               = "127.0.0.1:7420"
	DefaultHealthListen         = "127.0.0.1:7421"
	DefaultDrainTimeout         = 10 * time.Second
	DefaultHelloTimeout         = 10 * time.Second
	DefaultWriteProgressTimeout = 30 * time.Second
	DefaultMaxConnections       = 10000
	DefaultMaxPending           = 1024
	DefaultMaxPendingBytes      = 4 << 20
	DefaultMaxPendingBytesTotal = 64 << 20
	DefaultMaxOutboundBytes     = 4 << 20
	DefaultMaxOutboundTotal     = 64 << 20
	// DefaultMaxConnectionsPerAddress lets no one address hold more than
	// about a tenth of DefaultMaxConnections.
	DefaultMaxConnectionsPerAddress = 1024
	// DefaultConnectionRate is the new connections one address may open
	// a second.
	DefaultConnectionRate = 100
	// DefaultConversationRate is the new conversations one address may
	// create a second, and DefaultConversationBurst how many at once: at
	// that pace one address fills DefaultMaxConversations in more than a
	// day, and a client restarting with a hundred new conversations is
	// not slowed.
	DefaultConversationRate  = 10
	DefaultConversationBurst = 100
	// DefaultIPv4Prefix and DefaultIPv6Prefix are the prefixes of one
	// peer address: an IPv4 address, an IPv6 /64.
	DefaultIPv4Prefix = 32
	DefaultIPv6Prefix = 64
	// DefaultIdleTimeout closes a connection that holds no binding and
	// did nothing for that long.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultFrameReadTimeout bounds how long a frame's body may take to
	// arrive once its header did.
	DefaultFrameReadTimeout = 30 * time.Second
	// DefaultLogMemoryBytes bounds the log-first engine's uncheckpointed
	// batches in memory: four checkpoints' worth (a checkpoint starts at
	// 1 MiB logged). Small writes never reach it (64 clients telling 200
	// bytes peak below 2 MiB); a flood of large ones does, and waits for
	// the disk instead of holding more: a deaf recipient told 2 GiB of
	// 64 KiB tells peaks 4 to 12 MiB lower than at 8 MiB, at the same
	// rate (BENCHMARKS.md, "Memory").
	DefaultLogMemoryBytes = 4 << 20
	// DefaultWALSegmentSize is the size the log-first engine preallocates
	// each log segment to: 64 MiB.
	DefaultWALSegmentSize = 64 << 20
	// MinWALSegmentSize is the smallest WALSegmentSize: each segment costs
	// a file creation and two fsyncs, which a megabyte of records
	// amortizes.
	MinWALSegmentSize = 1 << 20
	// DefaultMaxDataBytes caps the store's bytes in use: 32 GiB.
	DefaultMaxDataBytes = 32 << 30
	// StoreFile is the bbolt file's name inside the data directory.
	StoreFile = "participantd.db"
)

// Version is the build's version (internal/buildinfo's VERSION file),
// announced in welcome.server as "participantd <Version>". The protocol
// has its own version, welcome.version.
var Version = buildinfo.Version()

// DefaultStoreCloseTimeout bounds what the shutdown waits for the store
// after the drain (StoreCloseTimeout). With DefaultDrainTimeout the whole
// shutdown stays within 25 s, below the 30 s a supervisor such as
// Kubernetes gives a process between SIGTERM and SIGKILL.
const DefaultStoreCloseTimeout = 15 * time.Second

// frameOverhead is what a tell or delivery frame needs besides its payload;
// max_frame must leave that much room above max_record_bytes.
const frameOverhead = 512

// Config configures a Server. The zero value means the defaults above.
type Config struct {
	// DataDir holds the store (StoreFile, and with the log-first engine its
	// log in wal/), the node key and LockFile; it is created, mode 0700, if
	// absent. See openDataDir for what a start refuses.
	DataDir string
	// Engine is the single-node store: EngineLog (the default) or
	// EngineBolt. Cluster mode keeps its data in etcd and ignores it.
	Engine string
	// Listen is the wire listener's address; port 0 picks a free one.
	Listen string
	// HealthListen is the address of /health, /ready, /metrics and
	// /unloadable-conversations.
	HealthListen string
	// AuthToken, when set, must equal every hello's auth (compared in
	// constant time).
	AuthToken string
	// TLSCert and TLSKey are PEM files; both or neither. When set the wire
	// listener serves TLS. Server.ReloadTLS reads them again.
	TLSCert, TLSKey string
	// TLSClientCA, with TLSCert, is a PEM file of the CAs that client
	// certificates must chain to: every wire connection must then present
	// one (mutual TLS). It adds to AuthToken, not replaces it.
	TLSClientCA string
	// WSListen is the WebSocket listener's address (PROTOCOL.md,
	// WebSocket); empty, the default, leaves it off. It serves the same
	// protocol under the same limits and TLS settings (wss with TLSCert).
	WSListen string
	// WSAllowedOrigins are the host patterns (path.Match, such as
	// "app.example.com" or "*.example.com") of the browser pages allowed
	// to connect besides the listener's own host, and the names a browser
	// may reach the listener by (its Host header) besides IP literals and
	// localhost, against DNS rebinding. A request without an Origin header
	// (not a browser) is always allowed.
	WSAllowedOrigins []string
	// HealthTLSCert and HealthTLSKey, both or neither, serve the health
	// listener over HTTPS. They are required for the admin endpoints or
	// pprof on a health listener beyond loopback (AdminRemote).
	HealthTLSCert, HealthTLSKey string
	// AdminRemote serves the admin endpoints (AdminToken) and pprof to
	// peers beyond loopback, which needs HealthTLSCert on a health
	// listener not bound to a loopback address (New refuses it
	// otherwise). Without it they answer loopback peers only, 403 to the
	// others, wherever the listener is bound.
	AdminRemote bool
	// HealthHosts are the host names the health listener answers to
	// besides IP literals and localhost: a request whose Host header
	// names anything else is refused (421), except /health and /ready,
	// so that a web page cannot reach the listener by DNS rebinding.
	HealthHosts []string
	// MaxConnectionsPerAddress caps the connections one peer address (an
	// IPv6 /64) holds; one more is rejected{overloaded}. Default
	// DefaultMaxConnectionsPerAddress. Loopback peers are exempt unless
	// LimitLoopback. Under TLSClientCA it, ConnectionRate and
	// ConversationRate also bound each client certificate identity,
	// whatever its address, loopback too (limits.go).
	MaxConnectionsPerAddress int
	// ConnectionRate is how many new connections a second one peer
	// address may open (a bucket of one second's worth, at least one);
	// past it they are rejected{overloaded}. Default
	// DefaultConnectionRate. Loopback peers are exempt unless
	// LimitLoopback.
	ConnectionRate float64
	// ConversationRate is how many new conversations a second one peer
	// address may create by enrolling, from a bucket of ConversationBurst;
	// past it such an enroll is rate_limited (enrolls into existing
	// conversations and replays are not counted). A loopback peer, exempt
	// unless LimitLoopback, gets a bucket per connection instead. Defaults
	// DefaultConversationRate and DefaultConversationBurst.
	ConversationRate  float64
	ConversationBurst int
	// IPv4Prefix and IPv6Prefix are the prefix lengths that make one peer
	// address, for the per-address limits and the shares (ClientShare,
	// the byte budgets' shares): every address of one /IPv4Prefix, or of
	// one /IPv6Prefix, is one peer. Defaults DefaultIPv4Prefix (each
	// address) and DefaultIPv6Prefix (a /64, what one host is usually
	// given); a /56 or /48 counts a site that is given many /64s as one
	// peer, at the cost of its hosts sharing one share.
	IPv4Prefix int
	IPv6Prefix int
	// LimitLoopback applies MaxConnectionsPerAddress, ConnectionRate and
	// ConversationRate to loopback peers as to any address. Off by
	// default: they are this machine, or a proxy in front of it.
	LimitLoopback bool
	// IdleTimeout closes, with bye{idle}, a connection that holds no
	// binding, has no request queued or running and nothing to write,
	// and read no frame for that long. Default DefaultIdleTimeout;
	// negative turns it off.
	IdleTimeout time.Duration
	// FrameReadTimeout bounds how long a frame's body may take to arrive
	// once its header did: the frame holds its size of the pending
	// budgets meanwhile. Past it the connection is closed (died,
	// connection_lost). Default DefaultFrameReadTimeout.
	FrameReadTimeout time.Duration
	// MaxFrame is the largest frame body accepted, announced in welcome.
	// Default wire.DefaultMaxFrame.
	MaxFrame int
	// MaxRecordBytes is the largest tell payload. Default
	// participant.DefaultMaxRecordBytes.
	MaxRecordBytes int
	// ReceiptTTL is how long enroll and attach answers replay their
	// secret. Default participant.DefaultReceiptTTL.
	ReceiptTTL time.Duration
	// DrainTimeout bounds the drain. Default DefaultDrainTimeout.
	DrainTimeout time.Duration
	// StoreCloseTimeout bounds what the shutdown waits, after the drain,
	// for the store: operations still inside it, the service's background
	// work, and closing it. Past it Run gives up on a store that stopped
	// answering (a dead disk, a hung NFS mount), logs what it was stuck in
	// and returns ErrStoreHung, so the whole shutdown takes at most
	// DrainTimeout + StoreCloseTimeout. Default DefaultStoreCloseTimeout.
	StoreCloseTimeout time.Duration
	// HelloTimeout is how long a connection may take to send hello.
	HelloTimeout time.Duration
	// WriteProgressTimeout closes a connection one of whose outbound
	// frames waited that long to be written: a peer that stops reading, or
	// reads too slowly for its queue to move. Default
	// DefaultWriteProgressTimeout.
	WriteProgressTimeout time.Duration
	// MaxConnections caps open connections; one more is
	// rejected{overloaded}.
	MaxConnections int
	// MaxPending caps the requests of one connection queued or running.
	MaxPending int
	// MaxPendingBytes caps the frame bytes of the requests of one
	// connection queued or running, and MaxPendingBytesTotal those of all
	// connections; past either, the connection's reader stops reading
	// until answers free room. Values below MaxFrame (the total: below
	// MaxPendingBytes) are raised to it. Defaults DefaultMaxPendingBytes
	// and DefaultMaxPendingBytesTotal.
	MaxPendingBytes      int
	MaxPendingBytesTotal int
	// MaxOutboundBytes caps the bytes of frames queued for one
	// connection's writer, and MaxOutboundTotal those of all connections;
	// past either, answers and pushes wait. Values below MaxFrame plus the
	// frame header (the total: below MaxOutboundBytes) are raised to it.
	// Defaults DefaultMaxOutboundBytes and DefaultMaxOutboundTotal.
	MaxOutboundBytes int
	MaxOutboundTotal int
	// MaxBacklogBytes caps the payload bytes of unacknowledged records the
	// service keeps in memory; past it they are read back from the store.
	// Default participant.DefaultMaxBacklogBytes.
	MaxBacklogBytes int
	// MaxBacklogRecords caps the records one conversation retains until
	// every recipient acknowledged them; past it, enroll, tell and attach
	// are backlog_full. Default participant.DefaultMaxBacklogRecords.
	MaxBacklogRecords int
	// BacklogRecords is the server's budget of retained records: past
	// it, the conversations retaining the most are backlog_full (see
	// docs/DESIGN.md, Publication). Default
	// participant.DefaultBacklogRecords.
	BacklogRecords int
	// ClientShare is the percentage of BacklogRecords and of
	// MaxConversations that the conversations of one peer address (the
	// key of MaxConnectionsPerAddress) may take; loopback is exempt unless
	// LimitLoopback. Under TLSClientCA a connection's share is its client
	// certificate identity's instead, whatever its address (conn.principal).
	// Default participant.DefaultClientShare.
	ClientShare int
	// LogMemoryBytes bounds what the log-first engine holds in memory of
	// batches committed to its log and not yet checkpointed into the bbolt
	// file: a Flush waits while it is reached. Default
	// DefaultLogMemoryBytes.
	LogMemoryBytes int
	// WALSegmentSize is the size the log-first engine preallocates each
	// log segment to; a start needs that much free space, plus the bbolt
	// file's next growth (see logfirst.StartSpace). At least
	// MinWALSegmentSize. Default DefaultWALSegmentSize.
	WALSegmentSize int
	// NoPipeline keeps every batch's turn of its conversation until its
	// commit is durable (participant.Options.NoPipeline): a diagnostic
	// switch, to measure a change against pipelined batches.
	NoPipeline bool
	// MaxParticipants caps participants per conversation. Default
	// participant.DefaultMaxParticipants.
	MaxParticipants int
	// MaxConversationsPerConn caps the bindings one connection holds.
	// Default participant.DefaultMaxConversationsPerConn.
	MaxConversationsPerConn int
	// EnrollPolicy is who may enroll: participant.EnrollOpen (the
	// default) or participant.EnrollInvite, under which every enroll must
	// carry an invitation minted with participantctl invite.
	EnrollPolicy participant.EnrollPolicy
	// MaxConversations caps the conversations of the store (in cluster
	// mode, the node's). Default MachineConversations: sized to the
	// memory the process may use.
	MaxConversations int
	// MaxDataBytes caps the bytes the store holds (single node): the
	// store file's pages in use, its free pages not counted, plus what
	// the log-first engine logged and not yet checkpointed into it. Once
	// reached, enroll and tell are capacity_exceeded until compaction
	// frees enough (the file never shrinks, but writes reuse its free
	// pages before it grows). Default DefaultMaxDataBytes; set it well
	// below the free space of the data directory's disk, less the file's
	// growth step and a log segment.
	MaxDataBytes int64
	// AdminToken, when set, enables the admin endpoints of the health
	// listener (admin.go) and pprof for requests that carry it as a bearer
	// token, and shows conversation ids in /unloadable-conversations to
	// them.
	AdminToken string
	// LocalAdminToken, when AdminToken is empty and the health listener
	// is on loopback, makes the server generate an admin token at each
	// start and write it to the data directory's AdminTokenFile (0600),
	// so that participantctl status works on the same host with no token
	// set up (participantd turns it on by default). When the
	// server generates none, it removes a file an earlier start left.
	LocalAdminToken bool
	// CheckpointInterval is how often conversation checkpoints are
	// written in the background; negative disables them. Default
	// participant.DefaultCheckpointInterval.
	CheckpointInterval time.Duration
	// CheckpointRows is how many rows past its checkpoint a conversation
	// must be for a new one. Default participant.DefaultCheckpointRows.
	CheckpointRows int
	// Retain is how long settled history is kept after the
	// acknowledgement that settled it. Default participant.DefaultRetain.
	Retain time.Duration
	// MaxUnackedAge, when positive, bounds how long a record waits for
	// its recipients' acknowledgements (participant.Options.MaxUnackedAge):
	// older ones are released, and a recipient that had not acknowledged
	// them gets a compacted notice. Zero (the default) waits forever.
	MaxUnackedAge time.Duration
	// TokenWindow, when positive, bounds token deduplication in time
	// (participant.Options.TokenWindow, docs/DESIGN.md "The token
	// window"): every token must be a UUIDv7, one older than the window
	// and not committed is refused token_expired, and compaction forgets
	// the tokens older than it. Zero (the default) keeps every token's
	// answer forever; negative is an error.
	TokenWindow time.Duration
	// TokenSkew is how far ahead of the server's clock a token's time may
	// be under a token window. Default participant.DefaultTokenSkew;
	// negative is an error. It may exceed TokenWindow.
	TokenSkew time.Duration
	// Logger receives the server's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// TracerProvider, if set, traces every request, the batch that
	// committed it and its barriers (trace.go), and puts the request's
	// trace and span ids on its log lines; nil (the default) traces
	// nothing, at no cost.
	TracerProvider trace.TracerProvider
	// WrapStore, when set, wraps the opened store before the service uses
	// it, for fault drills and tests (faultstore); nil uses it as is.
	WrapStore func(store.DurableStore) store.DurableStore
	// Now, when set, is the service's wall clock (participant.Options.Now:
	// token times, receipts, retention), for fault drills and tests of
	// clock skew; nil uses time.Now.
	Now func() time.Time
	// Pprof serves Go's profiles under /debug/pprof/ on the health
	// listener, to requests that carry AdminToken (which it needs), with
	// profile and trace durations capped at MaxProfileSeconds and no
	// cmdline. Off by default: a profile costs CPU and shows internals.
	Pprof bool
	// Cluster turns cluster mode on; the zero value is single-node mode.
	Cluster ClusterConfig
}

// withDefaults returns c with the defaults applied, or an error naming the
// first invalid setting.
func (c Config) withDefaults() (Config, error) {
	c.applyDefaults()
	return c, c.validate()
}

// applyDefaults sets every zero setting of c to its default.
func (c *Config) applyDefaults() {
	orDefault(&c.DataDir, DefaultDataDir)
	orDefault(&c.Listen, DefaultListen)
	orDefault(&c.HealthListen, DefaultHealthListen)
	orDefault(&c.MaxFrame, wire.DefaultMaxFrame)
	orDefault(&c.MaxRecordBytes, participant.DefaultMaxRecordBytes)
	orDefault(&c.ReceiptTTL, participant.DefaultReceiptTTL)
	orDefault(&c.CheckpointInterval, participant.DefaultCheckpointInterval)
	orDefault(&c.Retain, participant.DefaultRetain)
	orDefault(&c.TokenSkew, participant.DefaultTokenSkew)
	orDefault(&c.DrainTimeout, DefaultDrainTimeout)
	orDefault(&c.StoreCloseTimeout, DefaultStoreCloseTimeout)
	orDefault(&c.HelloTimeout, DefaultHelloTimeout)
	orDefault(&c.WriteProgressTimeout, DefaultWriteProgressTimeout)
	orDefault(&c.MaxConnections, DefaultMaxConnections)
	orDefault(&c.MaxConnectionsPerAddress, DefaultMaxConnectionsPerAddress)
	orDefault(&c.ConnectionRate, DefaultConnectionRate)
	orDefault(&c.ConversationRate, DefaultConversationRate)
	orDefault(&c.ConversationBurst, DefaultConversationBurst)
	orDefault(&c.IPv4Prefix, DefaultIPv4Prefix)
	orDefault(&c.IPv6Prefix, DefaultIPv6Prefix)
	orDefault(&c.IdleTimeout, DefaultIdleTimeout)
	orDefault(&c.FrameReadTimeout, DefaultFrameReadTimeout)
	orDefault(&c.Engine, EngineLog)
	orDefault(&c.MaxPending, DefaultMaxPending)
	// Each byte budget holds at least one frame, and each server-wide one
	// at least one connection's: smaller values are raised to that.
	orDefault(&c.MaxPendingBytes, DefaultMaxPendingBytes)
	c.MaxPendingBytes = max(c.MaxPendingBytes, c.MaxFrame)
	orDefault(&c.MaxPendingBytesTotal, DefaultMaxPendingBytesTotal)
	c.MaxPendingBytesTotal = max(c.MaxPendingBytesTotal, c.MaxPendingBytes)
	orDefault(&c.MaxOutboundBytes, DefaultMaxOutboundBytes)
	c.MaxOutboundBytes = max(c.MaxOutboundBytes, c.MaxFrame+wire.HeaderLen)
	orDefault(&c.MaxOutboundTotal, DefaultMaxOutboundTotal)
	c.MaxOutboundTotal = max(c.MaxOutboundTotal, c.MaxOutboundBytes)
	orDefault(&c.LogMemoryBytes, DefaultLogMemoryBytes)
	orDefault(&c.WALSegmentSize, DefaultWALSegmentSize)
	orDefault(&c.MaxBacklogBytes, participant.DefaultMaxBacklogBytes)
	// Backlog records (backpressure on retained records).
	orDefault(&c.MaxBacklogRecords, participant.DefaultMaxBacklogRecords)
	orDefault(&c.BacklogRecords, participant.DefaultBacklogRecords)
	orDefault(&c.ClientShare, participant.DefaultClientShare)
	orDefault(&c.EnrollPolicy, participant.EnrollOpen)
	if c.MaxConversations == 0 {
		c.MaxConversations = MachineConversations()
	}
	orDefault(&c.MaxDataBytes, DefaultMaxDataBytes)
}

// validate returns an error naming the first invalid setting of c, whose
// defaults are applied.
func (c *Config) validate() error {
	if c.Engine != EngineBolt && c.Engine != EngineLog {
		return fmt.Errorf("server: store %q: want %s or %s", c.Engine, EngineBolt, EngineLog)
	}
	if _, err := participant.ParseEnrollPolicy(string(c.EnrollPolicy)); err != nil {
		return fmt.Errorf("server: enroll-policy %q: want open or invite", c.EnrollPolicy)
	}
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("server: tls-cert and tls-key must be given together")
	case (c.HealthTLSCert == "") != (c.HealthTLSKey == ""):
		return errors.New("server: health-tls-cert and health-tls-key must be given together")
	case c.Pprof && c.AdminToken == "":
		return errors.New("server: pprof needs admin-token: profiles are served only to requests that carry it")
	case c.MaxConnectionsPerAddress < 0:
		return fmt.Errorf("server: max-connections-per-address %d is negative", c.MaxConnectionsPerAddress)
	case c.ConnectionRate < 0:
		return fmt.Errorf("server: connection-rate %v is negative", c.ConnectionRate)
	case c.ConversationRate < 0 || c.ConversationBurst < 0:
		return fmt.Errorf("server: conversation-rate %v or conversation-burst %d is negative", c.ConversationRate, c.ConversationBurst)
	case c.IPv4Prefix < 0 || c.IPv4Prefix > 32:
		return fmt.Errorf("server: ipv4-prefix %d is outside [1, 32]", c.IPv4Prefix)
	case c.IPv6Prefix < 0 || c.IPv6Prefix > 128:
		return fmt.Errorf("server: ipv6-prefix %d is outside [1, 128]", c.IPv6Prefix)
	case c.FrameReadTimeout < 0:
		return fmt.Errorf("server: frame-read-timeout %v is negative", c.FrameReadTimeout)
	case c.MaxFrame < 1024 || uint64(c.MaxFrame) > 1<<32-1:
		return fmt.Errorf("server: max-frame %d is outside [1024, 2^32-1]", c.MaxFrame)
	case c.MaxRecordBytes < 0 || c.MaxRecordBytes > c.MaxFrame-frameOverhead:
		return fmt.Errorf("server: max-record-bytes %d must be in [0, max-frame - %d = %d]", c.MaxRecordBytes, frameOverhead, c.MaxFrame-frameOverhead)
	case c.WALSegmentSize < MinWALSegmentSize:
		return fmt.Errorf("server: wal-segment-size %d is below the minimum %d (1 MiB)", c.WALSegmentSize, MinWALSegmentSize)
	case c.Retain < 0:
		return fmt.Errorf("server: retain %v is negative", c.Retain)
	case c.MaxUnackedAge < 0:
		return fmt.Errorf("server: max-unacked-age %v is negative (0 turns the bound off)", c.MaxUnackedAge)
	case c.TokenWindow < 0:
		return fmt.Errorf("server: token-window %v is negative (0 turns the window off)", c.TokenWindow)
	case c.TokenWindow > 0 && c.TokenWindow < time.Millisecond:
		// Tokens carry milliseconds, and welcome announces the window in
		// them: a shorter window would be announced as none.
		return fmt.Errorf("server: token-window %v is below 1ms (0 turns the window off)", c.TokenWindow)
	case c.TokenSkew < 0:
		return fmt.Errorf("server: token-skew %v is negative", c.TokenSkew)
	case c.ReceiptTTL < 0:
		return fmt.Errorf("server: receipt-ttl %v is negative", c.ReceiptTTL)
	case c.DrainTimeout < 0:
		return fmt.Errorf("server: drain-timeout %v is negative", c.DrainTimeout)
	case c.StoreCloseTimeout < 0:
		return fmt.Errorf("server: store-close-timeout %v is negative", c.StoreCloseTimeout)
	case c.HelloTimeout < 0:
		return fmt.Errorf("server: hello-timeout %v is negative", c.HelloTimeout)
	case c.WriteProgressTimeout < 0:
		return fmt.Errorf("server: write-progress-timeout %v is negative", c.WriteProgressTimeout)
	case c.MaxPendingBytes < 0 || c.MaxPendingBytesTotal < 0 || c.MaxOutboundBytes < 0 || c.MaxOutboundTotal < 0:
		return errors.New("server: a byte budget (max-pending-bytes[-total], max-outbound-bytes[-total]) is negative")
	case c.LogMemoryBytes < 0:
		return fmt.Errorf("server: log-memory %d is negative", c.LogMemoryBytes)
	case c.MaxBacklogBytes < 0:
		return fmt.Errorf("server: backlog-memory %d is negative", c.MaxBacklogBytes)
	case c.MaxBacklogRecords < 0:
		return fmt.Errorf("server: max-backlog-records %d is negative", c.MaxBacklogRecords)
	case c.BacklogRecords < 0:
		return fmt.Errorf("server: backlog-records %d is negative", c.BacklogRecords)
	case c.ClientShare < 0 || c.ClientShare > 100:
		return fmt.Errorf("server: client-share %d is not a percentage", c.ClientShare)
	case c.MaxConnections < 0:
		return fmt.Errorf("server: max-connections %d is negative", c.MaxConnections)
	case c.MaxParticipants < 0:
		return fmt.Errorf("server: max-participants %d is negative", c.MaxParticipants)
	case c.MaxConversationsPerConn < 0:
		return fmt.Errorf("server: max-conversations-per-connection %d is negative", c.MaxConversationsPerConn)
	case c.MaxPending < 0:
		return fmt.Errorf("server: max-pending %d is negative", c.MaxPending)
	case c.MaxConversations < 0:
		return fmt.Errorf("server: max-conversations %d is negative", c.MaxConversations)
	case c.MaxDataBytes < 0:
		return fmt.Errorf("server: max-data-bytes %d is negative", c.MaxDataBytes)
	}
	return nil
}

// orDefault sets *v to def when it holds its type's zero value, which in a
// Config means "the default".
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
