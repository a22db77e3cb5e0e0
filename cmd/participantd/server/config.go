package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/wire"
)

// Defaults of the zero Config.
const (
	DefaultDataDir        = "data"
	DefaultListen         = "127.0.0.1:7420"
	DefaultHealthListen   = "127.0.0.1:7421"
	DefaultDrainTimeout   = 10 * time.Second
	DefaultHelloTimeout   = 10 * time.Second
	DefaultWriteTimeout   = 30 * time.Second
	DefaultMaxConnections = 10000
	DefaultMaxPending     = 1024
	// Version is announced in welcome.server as "participantd <Version>".
	Version = "0.1.0"
	// StoreFile is the bbolt file's name inside the data directory.
	StoreFile = "participantd.db"
)

// frameOverhead is what a tell or delivery frame needs besides its payload;
// max_frame must leave that much room above max_record_bytes.
const frameOverhead = 512

// Config configures a Server. The zero value means the defaults above.
type Config struct {
	// DataDir holds the store (StoreFile and the log in wal/) and the node
	// key; it is created, mode 0700, if absent.
	DataDir string
	// Listen is the wire listener's address; port 0 picks a free one.
	Listen string
	// HealthListen is the address of /health, /ready, /metrics and
	// /unloadable-conversations.
	HealthListen string
	// AuthToken, when set, must equal every hello's auth (compared in
	// constant time).
	AuthToken string
	// TLSCert and TLSKey are PEM files; both or neither. When set the wire
	// listener serves TLS.
	TLSCert, TLSKey string
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
	// HelloTimeout is how long a connection may take to send hello.
	HelloTimeout time.Duration
	// WriteTimeout closes a connection whose peer accepted no bytes for
	// that long while the server had frames for it.
	WriteTimeout time.Duration
	// MaxConnections caps open connections; one more is
	// rejected{overloaded}.
	MaxConnections int
	// MaxPending caps the requests of one connection queued or running.
	MaxPending int
	// MaxParticipants caps participants per conversation. Default
	// participant.DefaultMaxParticipants.
	MaxParticipants int
	// MaxConversationsPerConn caps the bindings one connection holds.
	// Default participant.DefaultMaxConversationsPerConn.
	MaxConversationsPerConn int
	// Logger receives the server's logs; the zero value logs nothing.
	Logger zerolog.Logger
}

// withDefaults returns c with the defaults applied, or an error naming the
// first invalid setting.
func (c Config) withDefaults() (Config, error) {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.HealthListen == "" {
		c.HealthListen = DefaultHealthListen
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = wire.DefaultMaxFrame
	}
	if c.MaxRecordBytes == 0 {
		c.MaxRecordBytes = participant.DefaultMaxRecordBytes
	}
	if c.ReceiptTTL == 0 {
		c.ReceiptTTL = participant.DefaultReceiptTTL
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.MaxPending == 0 {
		c.MaxPending = DefaultMaxPending
	}
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return c, errors.New("server: tls-cert and tls-key must be given together")
	case c.MaxFrame < 1024 || uint64(c.MaxFrame) > 1<<32-1:
		return c, fmt.Errorf("server: max-frame %d is outside [1024, 2^32-1]", c.MaxFrame)
	case c.MaxRecordBytes < 0 || c.MaxRecordBytes > c.MaxFrame-frameOverhead:
		return c, fmt.Errorf("server: max-record-bytes %d must be in [0, max-frame - %d = %d]", c.MaxRecordBytes, frameOverhead, c.MaxFrame-frameOverhead)
	case c.ReceiptTTL < 0:
		return c, fmt.Errorf("server: receipt-ttl %v is negative", c.ReceiptTTL)
	case c.DrainTimeout < 0:
		return c, fmt.Errorf("server: drain-timeout %v is negative", c.DrainTimeout)
	case c.HelloTimeout < 0:
		return c, fmt.Errorf("server: hello-timeout %v is negative", c.HelloTimeout)
	case c.WriteTimeout < 0:
		return c, fmt.Errorf("server: write-timeout %v is negative", c.WriteTimeout)
	case c.MaxConnections < 0:
		return c, fmt.Errorf("server: max-connections %d is negative", c.MaxConnections)
	case c.MaxParticipants < 0:
		return c, fmt.Errorf("server: max-participants %d is negative", c.MaxParticipants)
	case c.MaxConversationsPerConn < 0:
		return c, fmt.Errorf("server: max-conversations-per-connection %d is negative", c.MaxConversationsPerConn)
	case c.MaxPending < 0:
		return c, fmt.Errorf("server: max-pending %d is negative", c.MaxPending)
	}
	return c, nil
}
