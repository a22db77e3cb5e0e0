package client

import (
	"crypto/tls"
	"time"

	"github.com/rs/zerolog"
)

// Defaults for the zero Options.
const (
	DefaultMinBackoff     = 50 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
	DefaultDeliveryBuffer = 256
	// DefaultMaxQueuedDeliveries is the default MaxQueuedDeliveries.
	DefaultMaxQueuedDeliveries = 65536
	DefaultDialTimeout         = 10 * time.Second
)

// Options configures a Client. The zero value means the defaults.
type Options struct {
	// AuthToken is sent in hello when non-empty.
	AuthToken string
	// TLS, when set, wraps the connection in TLS with this configuration.
	TLS *tls.Config
	// ClientName is sent in hello, for the server's logs.
	ClientName string
	// Logger receives the client's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// MinBackoff and MaxBackoff bound the delay between reconnection
	// attempts, and between retries of an in_doubt operation: it doubles
	// from MinBackoff up to MaxBackoff, each delay drawn uniformly from its
	// upper half. Defaults DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// DialTimeout bounds one connection attempt, handshake included.
	// Default DefaultDialTimeout.
	DialTimeout time.Duration
	// DeliveryBuffer is the capacity of the channel Deliveries returns.
	// Beyond it, up to MaxQueuedDeliveries more queue in memory until read,
	// so a slow reader does not stall the answers to its calls. Default
	// DefaultDeliveryBuffer.
	DeliveryBuffer int
	// MaxQueuedDeliveries bounds that queue. When it is full the client
	// stops reading from the connection until deliveries are read: memory
	// stays bounded, the server feels the backpressure, and answers wait
	// behind the deliveries. A client that never reads Deliveries should set
	// DiscardDeliveries. Default DefaultMaxQueuedDeliveries.
	MaxQueuedDeliveries int
	// OnCredential, if set, is called after every attach that changed a
	// held participant's credential (the generation and the secret), also
	// for the re-attachments after a reconnect, so that a caller can persist
	// it. It is called without locks held and must not call the Client.
	OnCredential func(Credential)
	// OnIntent, if set, is called before an enroll or attach is sent for
	// the first time (not before its retries, which reuse the token), also
	// for the re-attachments after a reconnect, so that a caller can
	// persist the token and recover the answer after a crash of its own;
	// see Intent. If it returns an error the request is not sent and the
	// call fails with it (a re-attachment is tried again on the next
	// connection). It is called without locks held and must not call the
	// Client.
	OnIntent func(Intent) error
	// DiscardDeliveries drops every delivery, for clients that only send.
	DiscardDeliveries bool
}

func (o *Options) withDefaults() {
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.MaxQueuedDeliveries <= 0 {
		o.MaxQueuedDeliveries = DefaultMaxQueuedDeliveries
	}
	if o.DeliveryBuffer <= 0 {
		o.DeliveryBuffer = DefaultDeliveryBuffer
	}
}
