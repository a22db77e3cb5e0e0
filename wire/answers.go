package wire

// Welcome accepts a hello.
type Welcome struct {
	Version        uint64 // Version
	Server         string // the server's name and version, for people
	Incarnation    uint64 // one more at every start of the server
	Connection     uint64 // this connection's ordinal within the incarnation
	MaxFrame       uint64 // the largest frame body the server accepts
	MaxRecordBytes uint64 // the largest tell payload
	// Node is this node's id in cluster mode (then Incarnation counts
	// that node's starts); empty, and absent on the wire, otherwise.
	Node string
	// TokenWindow and TokenSkew are the server's token window and the
	// skew it allows a token's time ahead of its clock, in milliseconds
	// (docs/PROTOCOL.md, Token window). Both are set, and on the wire,
	// only when the server runs a window; nil (absent) otherwise.
	TokenWindow *uint64
	TokenSkew   *uint64
}

// Rejected refuses the connection; the server closes it right after.
type Rejected struct {
	Reason Reason
	Detail string
}

// Enrolled answers Enroll with the new participant's credential.
type Enrolled struct {
	ID               uint64
	Conversation     uint64
	Participant      uint64
	Generation       uint64 // 1
	Secret           Secret
	Cursor           uint64 // 0
	ReceiptExpiresAt uint64 // unix milliseconds
	// Replay is set when the answer replays a committed enroll:
	// ReplayBound or ReplayUnbound. nil for a fresh answer.
	Replay *Replay
}

// Attached answers Attach with the new credential.
type Attached struct {
	ID               uint64
	Conversation     uint64
	Participant      uint64
	Generation       uint64 // the presented generation + 1
	Secret           Secret // new
	Cursor           uint64
	ReceiptExpiresAt uint64 // unix milliseconds
	// Replay is set when the answer replays a committed attach:
	// ReplayBound or ReplayUnbound. nil for a fresh answer.
	Replay *Replay
}

// Told answers Tell with the seq of its record.
type Told struct {
	ID           uint64
	Conversation uint64
	Seq          uint64
	Replay       *Replay // ReplayCommitted on a replay, else nil
}

// Acked answers Ack.
type Acked struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Cursor       uint64
	Noop         bool // through equalled the cursor
}

// Detached answers Detach with the seq of its last record.
type Detached struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Seq          uint64
	Replay       *Replay // ReplayCommitted on a replay, else nil
}

// Left answers Leave with the seq of its last record.
type Left struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Seq          uint64
	Replay       *Replay // ReplayCommitted on a replay, else nil
}

// Pong answers Ping.
type Pong struct {
	ID uint64
}

// Error refuses a request; the connection stays open. The extras are nil
// when absent: Generation for stale_authority (when the secret was right)
// and receipt_expired, Cursor for ack_gap and ack_regression, Limit for
// too_large, capacity_exceeded, backlog_full and rate_limited, Participant and Reason (ExpiredSuperseded
// or ExpiredDeadline) for receipt_expired, First for compacted, Oldest for
// token_expired, Newest for token_invalid (when the token was ahead of the
// server's clock).
//
// *Error implements the error interface, so a client may return it as is.
type Error struct {
	ID     uint64
	Code   Code
	Detail string

	Cursor      *uint64
	Limit       *uint64
	Participant *uint64
	Generation  *uint64
	Reason      *string
	// Owner is, for moved, the owner's advertised address (host:port);
	// nil when no node owns the conversation at the moment.
	Owner *string
	First *uint64
	// Oldest and Newest bound, in unix ms, the token times a server
	// running a token window accepts now: the oldest (token_expired) and
	// the newest (token_invalid of a token ahead of its clock).
	Oldest *uint64
	Newest *uint64
}

// Delivery pushes one record to a bound participant. It carries no id.
type Delivery struct {
	Conversation uint64
	Recipient    uint64 // the bound participant it is addressed to
	Seq          uint64
	Kind         Kind
	Participant  uint64 // the sender, or the participant the event is about
	// Payload is the record of a KindRecord delivery. nil when absent; a
	// present empty payload is a non-nil empty slice. Decoded messages own it.
	Payload []byte
	// Cause is why the binding ended, for KindDetached and KindDied; nil
	// when absent.
	Cause *Cause
}

// Compacted tells a bound participant that every record of Conversation
// below seq First no longer exists (docs/PROTOCOL.md, Compacted history):
// deliveries continue from the first record at or after First addressed to
// Recipient. It carries no id.
type Compacted struct {
	Conversation uint64
	Recipient    uint64
	First        uint64
}

// ServerBye announces that the server is closing the connection; its Reason
// is ByeShutdown, ByeIdle or ByeLeaseLost. Unlike the client's Bye it
// carries no id.
type ServerBye struct {
	Reason string
}

// Type returns TypeWelcome.
func (*Welcome) Type() string { return TypeWelcome }

// Type returns TypeRejected.
func (*Rejected) Type() string { return TypeRejected }

// Type returns TypeEnrolled.
func (*Enrolled) Type() string { return TypeEnrolled }

// Type returns TypeAttached.
func (*Attached) Type() string { return TypeAttached }

// Type returns TypeTold.
func (*Told) Type() string { return TypeTold }

// Type returns TypeAcked.
func (*Acked) Type() string { return TypeAcked }

// Type returns TypeDetached.
func (*Detached) Type() string { return TypeDetached }

// Type returns TypeLeft.
func (*Left) Type() string { return TypeLeft }

// Type returns TypePong.
func (*Pong) Type() string { return TypePong }

// Type returns TypeError.
func (*Error) Type() string { return TypeError }

// Type returns TypeDelivery.
func (*Delivery) Type() string { return TypeDelivery }

// Type returns TypeBye.
func (*ServerBye) Type() string { return TypeBye }

// Type returns TypeCompacted.
func (*Compacted) Type() string { return TypeCompacted }

func (m *Enrolled) msgID() uint64 { return m.ID }
func (m *Attached) msgID() uint64 { return m.ID }
func (m *Told) msgID() uint64     { return m.ID }
func (m *Acked) msgID() uint64    { return m.ID }
func (m *Detached) msgID() uint64 { return m.ID }
func (m *Left) msgID() uint64     { return m.ID }
func (m *Pong) msgID() uint64     { return m.ID }
func (m *Error) msgID() uint64    { return m.ID }

// Error returns the code and detail, prefixed "wire: server error".
func (m *Error) Error() string {
	return "wire: server error " + string(m.Code) + ": " + m.Detail
}

func (m *Welcome) appendBody(b []byte) []byte {
	n := 7 + count(m.TokenWindow) + count(m.TokenSkew)
	if m.Node != "" {
		n++
	}
	b = kvUint(head(b, n, TypeWelcome), "version", m.Version)
	b = kvStr(b, "server", m.Server)
	b = kvUint(b, "incarnation", m.Incarnation)
	b = kvUint(b, "connection", m.Connection)
	b = kvUint(b, "max_frame", m.MaxFrame)
	b = kvUint(b, "max_record_bytes", m.MaxRecordBytes)
	if m.Node != "" {
		b = kvStr(b, "node", m.Node)
	}
	if m.TokenWindow != nil {
		b = kvUint(b, "token_window", *m.TokenWindow)
	}
	if m.TokenSkew != nil {
		b = kvUint(b, "token_skew", *m.TokenSkew)
	}
	return b
}

func (m *Welcome) decode(d *decoder) {
	m.Version = d.uint(kVersion)
	m.Server = d.str(kServer)
	m.Incarnation = d.uint(kIncarnation)
	m.Connection = d.uint(kConnection)
	m.MaxFrame = d.uint(kMaxFrame)
	m.MaxRecordBytes = d.uint(kMaxRecordBytes)
	if node := d.optStr(kNode); node != nil {
		m.Node = *node
	}
	m.TokenWindow = d.optUint(kTokenWindow)
	m.TokenSkew = d.optUint(kTokenSkew)
}

func (m *Rejected) appendBody(b []byte) []byte {
	b = kvStr(head(b, 3, TypeRejected), "reason", string(m.Reason))
	return kvStr(b, "detail", m.Detail)
}

func (m *Rejected) decode(d *decoder) {
	m.Reason = Reason(d.str(kReason))
	m.Detail = d.str(kDetail)
}

// appendCredential appends the fields Enrolled and Attached share.
func appendCredential(b []byte, typ string, id, conv, part, gen uint64, secret *Secret, cursor, expires uint64, replay *Replay) []byte {
	b = kvUint(head(b, 8+count(replay), typ), "id", id)
	b = kvUint(b, "conversation", conv)
	b = kvUint(b, "participant", part)
	b = kvUint(b, "generation", gen)
	b = kvBin(b, "secret", secret[:])
	b = kvUint(b, "cursor", cursor)
	b = kvUint(b, "receipt_expires_at", expires)
	return appendReplay(b, replay)
}

func appendReplay(b []byte, r *Replay) []byte {
	if r != nil {
		b = kvStr(b, "replay", string(*r))
	}
	return b
}

func (d *decoder) replay() *Replay {
	s, ok := d.strBytes(kReplay, true)
	if !ok {
		return nil
	}
	var r Replay
	switch string(s) { // the known values cost no allocation
	case string(ReplayBound):
		r = ReplayBound
	case string(ReplayUnbound):
		r = ReplayUnbound
	case string(ReplayCommitted):
		r = ReplayCommitted
	default:
		r = Replay(s)
	}
	return &r
}

func (m *Enrolled) appendBody(b []byte) []byte {
	return appendCredential(b, TypeEnrolled, m.ID, m.Conversation, m.Participant, m.Generation,
		&m.Secret, m.Cursor, m.ReceiptExpiresAt, m.Replay)
}

func (m *Enrolled) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Secret = d.secret(kSecret)
	m.Cursor = d.uint(kCursor)
	m.ReceiptExpiresAt = d.uint(kReceiptExpiresAt)
	m.Replay = d.replay()
}

func (m *Attached) appendBody(b []byte) []byte {
	return appendCredential(b, TypeAttached, m.ID, m.Conversation, m.Participant, m.Generation,
		&m.Secret, m.Cursor, m.ReceiptExpiresAt, m.Replay)
}

func (m *Attached) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Secret = d.secret(kSecret)
	m.Cursor = d.uint(kCursor)
	m.ReceiptExpiresAt = d.uint(kReceiptExpiresAt)
	m.Replay = d.replay()
}

func (m *Told) appendBody(b []byte) []byte {
	b = kvUint(head(b, 4+count(m.Replay), TypeTold), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "seq", m.Seq)
	return appendReplay(b, m.Replay)
}

func (m *Told) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Seq = d.uint(kSeq)
	m.Replay = d.replay()
}

func (m *Acked) appendBody(b []byte) []byte {
	b = kvUint(head(b, 6, TypeAcked), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "participant", m.Participant)
	b = kvUint(b, "cursor", m.Cursor)
	return kvBool(b, "noop", m.Noop)
}

func (m *Acked) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Cursor = d.uint(kCursor)
	m.Noop = d.bool(kNoop)
}

func appendEnded(b []byte, typ string, id, conv, part, seq uint64, replay *Replay) []byte {
	b = kvUint(head(b, 5+count(replay), typ), "id", id)
	b = kvUint(b, "conversation", conv)
	b = kvUint(b, "participant", part)
	b = kvUint(b, "seq", seq)
	return appendReplay(b, replay)
}

func (m *Detached) appendBody(b []byte) []byte {
	return appendEnded(b, TypeDetached, m.ID, m.Conversation, m.Participant, m.Seq, m.Replay)
}

func (m *Detached) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Seq = d.uint(kSeq)
	m.Replay = d.replay()
}

func (m *Left) appendBody(b []byte) []byte {
	return appendEnded(b, TypeLeft, m.ID, m.Conversation, m.Participant, m.Seq, m.Replay)
}

func (m *Left) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Seq = d.uint(kSeq)
	m.Replay = d.replay()
}

func (m *Pong) appendBody(b []byte) []byte { return kvUint(head(b, 2, TypePong), "id", m.ID) }

func (m *Error) appendBody(b []byte) []byte {
	n := 4 + count(m.Cursor) + count(m.Limit) + count(m.Participant) + count(m.Generation) + count(m.Reason) + count(m.Owner) + count(m.First) + count(m.Oldest) + count(m.Newest)
	b = kvUint(head(b, n, TypeError), "id", m.ID)
	b = kvStr(b, "code", string(m.Code))
	b = kvStr(b, "detail", m.Detail)
	if m.Cursor != nil {
		b = kvUint(b, "cursor", *m.Cursor)
	}
	if m.Limit != nil {
		b = kvUint(b, "limit", *m.Limit)
	}
	if m.Participant != nil {
		b = kvUint(b, "participant", *m.Participant)
	}
	if m.Generation != nil {
		b = kvUint(b, "generation", *m.Generation)
	}
	if m.Reason != nil {
		b = kvStr(b, "reason", *m.Reason)
	}
	if m.Owner != nil {
		b = kvStr(b, "owner", *m.Owner)
	}
	if m.First != nil {
		b = kvUint(b, "first", *m.First)
	}
	if m.Oldest != nil {
		b = kvUint(b, "oldest", *m.Oldest)
	}
	if m.Newest != nil {
		b = kvUint(b, "newest", *m.Newest)
	}
	return b
}

func (m *Error) decode(d *decoder) {
	m.Code = Code(d.str(kCode))
	m.Detail = d.str(kDetail)
	m.Cursor = d.optUint(kCursor)
	m.Limit = d.optUint(kLimit)
	m.Participant = d.optUint(kParticipant)
	m.Generation = d.optUint(kGeneration)
	m.Reason = d.optStr(kReason)
	m.Owner = d.optStr(kOwner)
	m.First = d.optUint(kFirst)
	m.Oldest = d.optUint(kOldest)
	m.Newest = d.optUint(kNewest)
}

func (m *Delivery) appendBody(b []byte) []byte {
	n := 6 + count(m.Cause)
	if m.Payload != nil {
		n++
	}
	b = kvUint(head(b, n, TypeDelivery), "conversation", m.Conversation)
	b = kvUint(b, "recipient", m.Recipient)
	b = kvUint(b, "seq", m.Seq)
	b = kvStr(b, "kind", string(m.Kind))
	b = kvUint(b, "participant", m.Participant)
	if m.Payload != nil {
		b = kvBin(b, "payload", m.Payload)
	}
	if m.Cause != nil {
		b = kvStr(b, "cause", string(*m.Cause))
	}
	return b
}

func (m *Delivery) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Recipient = d.uint(kRecipient)
	m.Seq = d.uint(kSeq)
	m.Kind = d.kind()
	m.Participant = d.uint(kParticipant)
	m.Payload = d.payload(kPayload, true)
	if s, ok := d.strBytes(kCause, true); ok {
		c := Cause(s)
		m.Cause = &c
	}
}

// kind reads the delivery kind; the known kinds cost no allocation.
func (d *decoder) kind() Kind {
	s, _ := d.strBytes(kKind, false)
	for _, k := range [...]Kind{KindRecord, KindJoined, KindAttached, KindDetached, KindDied, KindLeft} {
		if string(s) == string(k) {
			return k
		}
	}
	return Kind(s)
}

func (m *Compacted) appendBody(b []byte) []byte {
	b = kvUint(head(b, 4, TypeCompacted), "conversation", m.Conversation)
	b = kvUint(b, "recipient", m.Recipient)
	return kvUint(b, "first", m.First)
}

func (m *Compacted) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Recipient = d.uint(kRecipient)
	m.First = d.uint(kFirst)
}

func (m *ServerBye) appendBody(b []byte) []byte {
	return kvStr(head(b, 2, TypeBye), "reason", m.Reason)
}

func (m *ServerBye) decode(d *decoder) {
	m.Reason = d.str(kReason)
}
