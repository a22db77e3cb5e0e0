// Package client is the Go client of participantd: it speaks the wire
// protocol of docs/PROTOCOL.md over one connection at a time, pipelines requests
// (many calls in flight, answers matched by id), and hides the failures a
// durable client must survive.
//
// # Guarantees
//
//   - Every intended operation gets one token (NewToken: a UUIDv7, the time
//     it was drawn then 74 random bits, never all zero), reused on every
//     retry of it. An operation answered in_doubt, or whose connection
//     drops before its answer, is retried with the same token until its
//     outcome is known, so it is applied at most once.
//   - A server running a token window (docs/PROTOCOL.md, Token window)
//     refuses a token older than the window that it does not find
//     committed (token_expired), and one that is not a UUIDv7 or is ahead
//     of its clock (token_invalid). Both are final: nothing was done, the
//     client never retries them, and the call returns ErrTokenExpired or
//     ErrTokenInvalid. After token_expired an earlier send of the token
//     may have committed: send again, with a new token, only an operation
//     known not to have committed. The exception is an attach (a
//     re-attachment after a reconnect, or Attach) refused token_expired
//     for a token the client drew: it is retried once with a new token
//     (passed to OnIntent before it is sent) and the same presented
//     credential, which is safe because an earlier committed send moved
//     the generation on, so the retry is then refused stale_authority
//     instead of attaching twice. An attach whose renewed token expires
//     too, whose token the caller supplied (WithToken), or that is refused
//     token_invalid loses its participant (OnLost after a reconnect, a
//     *LostError), as receipt_expired does.
//   - An enroll, tell or attach refused backlog_full (its conversation, or
//     the server, retains as many unacknowledged records as it may) is
//     retried with backoff and the same token for up to
//     Options.BacklogWait, so a sender slows down to the pace its
//     recipients acknowledge at; past it the call returns ErrBacklogFull
//     (nothing was done).
//   - After a lost connection the client reconnects with exponential backoff
//     and jitter and re-attaches every participant it holds, presenting its
//     latest credential. Each attach mints a new generation and secret; the
//     client keeps them, and an attach whose answer was lost is retried with
//     the same token and the same presented credential. Requests wait for the
//     re-attachment before they are sent again.
//   - A re-attachment refused backlog_full (its conversation is full) does
//     not hold the connection back from the other participants: it is
//     deferred after one try, the connection serves everyone else, and a
//     background retry (backoff between MinBackoff and MaxBackoff, the same
//     token and presented credential) attaches it on that connection once
//     the backlog drains, unless a permanent refusal loses it (OnLost), its
//     conversation moved, or the connection ends first (the next one
//     re-attaches it as usual). Until then it is not bound: Tell, Ack and
//     Detach of it are refused ErrNoBinding (nothing was done; retry
//     later), and Attach of it tries at once with the same intent, for up
//     to BacklogWait.
//   - A call ends in one of three truths (docs/clients.md, What a client's
//     answers promise): success (it committed, and nothing the client did
//     on its own undid it), a refusal (nothing was done), or an in_doubt
//     *Error carrying its token, returned only when a request carrying the
//     token may have reached the server (it was written, and no answer
//     since proved its token not committed) and the call ended before its
//     outcome was known. A call refused every time with "nothing done"
//     (unavailable, moved, a failed dial) is never in_doubt.
//   - Detach and Leave stop the client from binding their participant on
//     its own before their request is sent: no re-attachment after a
//     reconnect, deferred re-attachment or Cluster follower binds it again,
//     and a retry after a lost answer is sent as it is (a detach that did
//     not commit is then refused no_binding: the binding ended with the
//     connection). A participant's re-attachment refused retired while
//     its Leave is in flight is not reported lost.
//   - An ack below the cursor (ack_regression: a later ack passed it) is
//     acked: Ack returns the cursor.
//   - A tell larger than max_record_bytes, or a request whose frame
//     exceeds max_frame (both from the welcome), is refused too_large
//     before anything is sent: final, never retried, never in_doubt. The
//     limits are those of the session the call gets: a call whose ctx
//     ends before a session is ready ends with ctx's error, unsent.
//   - No call waits forever on an open connection: a request unanswered
//     for Options.AnswerTimeout ends its connection as lost, and the
//     calls on it are retried on the next one with their tokens.
//   - Deliveries are deduplicated on (conversation, recipient, seq), and
//     compacted notices on (conversation, recipient, first), before they
//     reach the channel returned by Deliveries: each participant has a
//     cursor of its own. Each carries the credential of its recipient, to
//     Ack it with.
//   - The caller hears what happened: OnDisconnect when a connection ends,
//     OnCredential for every re-attachment, OnReconnect once they are done,
//     OnLost once for a participant the client can no longer use. The
//     server never tells a superseded binding, so the client notices a
//     supersession from a refused request, or from its binding check (an
//     ack at the cursor every BindingCheckInterval, which changes nothing).
//     A lost participant is not re-attached after a reconnect: the session
//     that took it over keeps it.
//
// # Surviving a crash of the caller
//
// The client retries within its own lifetime; a process that dies after an
// enroll or attach committed but before its answer arrived loses the new
// secret, and a credential file still holding the previous generation no
// longer attaches. Options.OnIntent closes that gap: it is called with the
// token and presented credential before the first send, and a caller that
// persists them durably (participantctl writes them into its credential
// file, atomically) retries after a restart with WithToken:
//
//	intent persisted       ->  request sent  ->  answer  ->  credential persisted, intent cleared
//	restart with an intent ->  Attach(ctx, intent.Presented, WithToken(intent.Token))
//
// The server replays the original answer (docs/PROTOCOL.md, Replays), then the
// client attaches again with the minted credential. A replay is refused
// with receipt_expired once receipt_ttl passed or a later attach superseded
// it: the credential is then lost (a *LostError), as without the intent.
//
// # Operations and what they need
//
//	operation  needs                         retried after a lost answer
//	Enroll     -                             yes (same token)
//	Attach     the credential                yes (same token, same credential)
//	Tell       the binding on this client    yes (same token)
//	Ack        the binding on this client    yes (acks are cumulative)
//	Detach     the binding on this client    yes (same token)
//	Leave      the credential                yes (same token)
//	Ping       -                             no
//
// # Clusters
//
// A Client speaks to one address. Cluster (DialCluster) speaks to a
// participantd cluster: one Client per node it needs, each conversation
// routed to its owner, moved{owner} followed with the same token (at
// most MaxMoved times in a row per call, with backoff and jitter from
// the second), a participant re-attached on its conversation's new owner,
// and nodes that are unreachable, do not answer within AttemptTimeout or
// answer unavailable (cut off from etcd, say) or shutting_down skipped
// for another, with backoff. The Clients of a Cluster share one attach
// intent per participant, so an attach keeps its token and presented
// credential on every node it is tried on. A participant the Cluster
// holds bound follows its conversation by itself: when its node's
// connection ends (EOF, bye) or the node no longer owns the conversation
// (moved, or no_binding at the current generation), the Cluster attaches
// it on the new owner, and deliveries resume there, deduplicated across
// nodes (ClusterOptions.OnFollow, OnWait say so). A plain Client's
// re-attachment answered moved forgets the participant instead of
// retrying it on that node; its binding check answered moved marks it
// unbound, to be re-attached on the next connection.
//
// # Goroutines
//
// A Client owns a supervisor goroutine (connects, reconnects, re-attaches),
// one reader goroutine per live connection, one goroutine feeding the
// deliveries channel, one checking bindings, and one per deferred
// re-attachment, which ends with its connection. A Cluster owns its
// Clients, one forwarder per Client and one follower per participant it
// is attaching on a new owner. Close stops and waits for all of them.
//
// # Locks
//
// Cluster.mu is never held across I/O; it is taken before a Client.mu,
// never after. Client.mu is never held across I/O. session.mu is taken
// alone. intents.mu (the attach intents, shared by a Cluster's Clients) is
// a leaf: taken with either held, nothing taken under it.
// member.attachMu (a one-slot channel, so that a call waiting for an
// attach in flight may give up with its context) serializes one Client's
// attaches of one participant and is held across I/O; it is taken before
// Client.mu, never after. A Cluster's lockOp of a participant serializes
// its follower's attach with the release of a Detach or Leave; held
// across I/O, it is taken before Cluster.mu and any attachMu, never after
// (lockOp takes Cluster.mu only to find or drop the lock, never while
// holding it).
package client
