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
	// DefaultBindingCheckInterval is the default BindingCheckInterval.
	DefaultBindingCheckInterval = 30 * time.Second
	// DefaultBacklogWait is the default BacklogWait.
	DefaultBacklogWait = 30 * time.Second
	// DefaultAnswerTimeout is the default AnswerTimeout.
	DefaultAnswerTimeout = 30 * time.Second
)

// Options configures a Client. The zero value means the defaults.
//
// The callbacks (OnCredential, OnDisconnect, OnReconnect, OnLost) run on the
// client's goroutines without its locks held: they must return soon and
// must not call the Client (hand such work to another goroutine).
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
	// see Intent. It is called again, with the new token, before the
	// first send of the token that replaces an attach's expired one (see
	// CodeTokenExpired). If it returns an error the request is not sent
	// and the call fails with it (a re-attachment is tried again on the
	// next connection). It is called without locks held and must not call
	// the Client.
	OnIntent func(Intent) error
	// DiscardDeliveries drops every delivery, for clients that only send.
	DiscardDeliveries bool

	// OnDisconnect, if set, is called when the connection ends other than
	// by Close or by the server's bye{idle}, with why. The client then
	// reconnects on its own; calls wait for it. A connection closed for
	// idleness held no binding: it ends quietly (neither OnDisconnect nor
	// OnReconnect), and the next one is dialed, without backoff, when a
	// call needs it.
	OnDisconnect func(err error)
	// OnReconnect, if set, is called when a new connection is up after a
	// disconnect and every held participant that could be re-attached is
	// bound on it (OnCredential was called for each), with what the server
	// announced. A participant whose re-attachment was refused
	// backlog_full is not bound yet: it is attached in the background
	// (OnCredential then), see the package documentation.
	OnReconnect func(Welcome)
	// OnLost, if set, is called once for each held participant the client
	// can no longer use, with the last credential it held and why: a
	// *LostError that matches ErrParticipantLost and one of
	// ErrBindingSuperseded (another session attached the participant, or
	// its binding ended elsewhere), ErrRetired (it left), or the refusal
	// of its re-attachment (ErrStaleAuthority, ErrReceiptExpired,
	// ErrUnknownParticipant). The client no longer re-attaches it; Attach
	// with a newer credential takes it up again.
	OnLost func(cred Credential, reason error)
	// BindingCheckInterval is how often the client checks that each
	// participant it holds bound is still bound on its connection, so
	// that a supersession is noticed (OnLost) even when nothing is sent:
	// the server never tells the superseded binding. The check is a
	// cumulative ack at the cursor, which changes nothing. Default
	// DefaultBindingCheckInterval; negative: never.
	BindingCheckInterval time.Duration
	// BacklogWait is how long an enroll, tell or attach answered
	// backlog_full (its conversation, or the server, retains as many
	// unacknowledged records as it may) is retried, with backoff and the
	// same token, before the call returns that *Error (ErrBacklogFull:
	// nothing was done). The retries slow the sender down to the pace its
	// recipients acknowledge at; the call's context bounds them too, and
	// its end also returns the backlog_full *Error. The re-attachments
	// after a reconnect do not wait it out: one refused backlog_full is
	// deferred and retried in the background (see the package
	// documentation). Default DefaultBacklogWait; negative: return it at
	// once.
	BacklogWait time.Duration
	// AnswerTimeout bounds how long a request waits for its answer on an
	// open connection, whatever the call's context says: past it the
	// connection is taken for lost (a server or network that dropped the
	// answer, or stopped answering), it is closed, and every call on it is
	// retried on the next one as after a lost connection (with its
	// token, which learns its outcome). Default DefaultAnswerTimeout;
	// negative: never.
	AnswerTimeout time.Duration
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
	if o.BacklogWait == 0 {
		o.BacklogWait = DefaultBacklogWait
	}
	if o.AnswerTimeout == 0 {
		o.AnswerTimeout = DefaultAnswerTimeout
	}
	if o.BindingCheckInterval == 0 {
		o.BindingCheckInterval = DefaultBindingCheckInterval
	}
}
