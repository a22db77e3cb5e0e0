package wire

// Hello is the first frame of every connection. It carries no id.
type Hello struct {
	// Versions are the protocol versions the client speaks; the server
	// requires Version among them.
	Versions []uint64
	// Auth is the shared auth token, nil when absent.
	Auth *string
	// Client names the client for the server's logs, nil when absent.
	Client *string
}

// Enroll asks to create a participant in Conversation (creating the
// conversation on first use) and to bind it to this connection.
type Enroll struct {
	ID           uint64
	Conversation uint64
	Token        Token
	// Invite is the operator's invitation to Conversation, nil when absent
	// (at most MaxInvite bytes). A server whose enroll policy is invite
	// requires it.
	Invite []byte
}

// Attach presents a credential, mints Generation+1 and a new secret, and
// binds the participant to this connection.
type Attach struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Generation   uint64
	Secret       Secret
	Token        Token
}

// Tell appends Payload to the conversation as a record.
type Tell struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Generation   uint64
	Token        Token
	// Payload is the record. Encoded as a bin even when nil; decoded
	// messages own it (it never aliases the frame).
	Payload []byte
}

// Ack acknowledges every record through seq Through.
type Ack struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Generation   uint64
	Through      uint64
}

// Detach ends the participant's binding, cleanly.
type Detach struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Generation   uint64
	Token        Token
}

// Leave retires the participant for good.
type Leave struct {
	ID           uint64
	Conversation uint64
	Participant  uint64
	Generation   uint64
	Secret       Secret
	Token        Token
}

// Ping asks for a Pong with the same id.
type Ping struct {
	ID uint64
}

// Bye asks the server to end this connection's bindings as detached/clean
// and close. It gets no answer.
type Bye struct {
	ID uint64
}

// Type returns TypeHello.
func (*Hello) Type() string { return TypeHello }

// Type returns TypeEnroll.
func (*Enroll) Type() string { return TypeEnroll }

// Type returns TypeAttach.
func (*Attach) Type() string { return TypeAttach }

// Type returns TypeTell.
func (*Tell) Type() string { return TypeTell }

// Type returns TypeAck.
func (*Ack) Type() string { return TypeAck }

// Type returns TypeDetach.
func (*Detach) Type() string { return TypeDetach }

// Type returns TypeLeave.
func (*Leave) Type() string { return TypeLeave }

// Type returns TypePing.
func (*Ping) Type() string { return TypePing }

// Type returns TypeBye.
func (*Bye) Type() string { return TypeBye }

// Request is a message a client sends with an id: every client message
// but *Hello.
type Request interface {
	Message
	// SetID sets the id the request carries (and its answer echoes).
	SetID(id uint64)
}

// Operation is a request about one conversation: *Enroll, *Attach,
// *Tell, *Ack, *Detach or *Leave. A server runs a conversation's
// operations in the order it reads them.
type Operation interface {
	Request
	// ConversationID returns the conversation the request is about.
	ConversationID() uint64
}

// Every request that operates on a conversation is an Operation: the
// server routes it by ConversationID, the client numbers it with SetID.
var (
	_ Operation = (*Enroll)(nil)
	_ Operation = (*Attach)(nil)
	_ Operation = (*Tell)(nil)
	_ Operation = (*Ack)(nil)
	_ Operation = (*Detach)(nil)
	_ Operation = (*Leave)(nil)
	_ Request   = (*Ping)(nil)
	_ Request   = (*Bye)(nil)
)

func (m *Enroll) msgID() uint64 { return m.ID }
func (m *Attach) msgID() uint64 { return m.ID }
func (m *Tell) msgID() uint64   { return m.ID }
func (m *Ack) msgID() uint64    { return m.ID }
func (m *Detach) msgID() uint64 { return m.ID }
func (m *Leave) msgID() uint64  { return m.ID }
func (m *Ping) msgID() uint64   { return m.ID }
func (m *Bye) msgID() uint64    { return m.ID }

// SetID sets m.ID.
func (m *Enroll) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Attach) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Tell) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Ack) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Detach) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Leave) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Ping) SetID(id uint64) { m.ID = id }

// SetID sets m.ID.
func (m *Bye) SetID(id uint64) { m.ID = id }

// ConversationID returns m.Conversation.
func (m *Enroll) ConversationID() uint64 { return m.Conversation }

// ConversationID returns m.Conversation.
func (m *Attach) ConversationID() uint64 { return m.Conversation }

// ConversationID returns m.Conversation.
func (m *Tell) ConversationID() uint64 { return m.Conversation }

// ConversationID returns m.Conversation.
func (m *Ack) ConversationID() uint64 { return m.Conversation }

// ConversationID returns m.Conversation.
func (m *Detach) ConversationID() uint64 { return m.Conversation }

// ConversationID returns m.Conversation.
func (m *Leave) ConversationID() uint64 { return m.Conversation }

func (m *Hello) appendBody(b []byte) []byte {
	b = head(b, 2+count(m.Auth)+count(m.Client), TypeHello)
	b = appendArrayHeader(appendStr(b, "versions"), len(m.Versions))
	for _, v := range m.Versions {
		b = appendUint(b, v)
	}
	if m.Auth != nil {
		b = kvStr(b, "auth", *m.Auth)
	}
	if m.Client != nil {
		b = kvStr(b, "client", *m.Client)
	}
	return b
}

func (m *Hello) decode(d *decoder) {
	m.Versions = d.uintArray(kVersions)
	m.Auth = d.optStr(kAuth)
	m.Client = d.optStr(kClient)
}

func (m *Enroll) appendBody(b []byte) []byte {
	n := 4
	if m.Invite != nil {
		n++
	}
	b = kvUint(head(b, n, TypeEnroll), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvBin(b, "token", m.Token[:])
	if m.Invite != nil {
		b = kvBin(b, "invite", m.Invite)
	}
	return b
}

func (m *Enroll) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Token = d.token(kToken)
	m.Invite = d.payload(kInvite, true)
	if len(m.Invite) > MaxInvite {
		d.fail(kInvite, "%d bytes, at most %d", len(m.Invite), MaxInvite)
	}
}

func (m *Attach) appendBody(b []byte) []byte {
	b = kvUint(head(b, 7, TypeAttach), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "participant", m.Participant)
	b = kvUint(b, "generation", m.Generation)
	b = kvBin(b, "secret", m.Secret[:])
	return kvBin(b, "token", m.Token[:])
}

func (m *Attach) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Secret = d.secret(kSecret)
	m.Token = d.token(kToken)
}

func (m *Tell) appendBody(b []byte) []byte {
	b = kvUint(head(b, 7, TypeTell), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "participant", m.Participant)
	b = kvUint(b, "generation", m.Generation)
	b = kvBin(b, "token", m.Token[:])
	return kvBin(b, "payload", m.Payload)
}

func (m *Tell) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Token = d.token(kToken)
	m.Payload = d.payload(kPayload, false)
}

func (m *Ack) appendBody(b []byte) []byte {
	b = kvUint(head(b, 6, TypeAck), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "participant", m.Participant)
	b = kvUint(b, "generation", m.Generation)
	return kvUint(b, "through", m.Through)
}

func (m *Ack) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Through = d.uint(kThrough)
}

func (m *Detach) appendBody(b []byte) []byte {
	b = kvUint(head(b, 6, TypeDetach), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "participant", m.Participant)
	b = kvUint(b, "generation", m.Generation)
	return kvBin(b, "token", m.Token[:])
}

func (m *Detach) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Token = d.token(kToken)
}

func (m *Leave) appendBody(b []byte) []byte {
	b = kvUint(head(b, 7, TypeLeave), "id", m.ID)
	b = kvUint(b, "conversation", m.Conversation)
	b = kvUint(b, "participant", m.Participant)
	b = kvUint(b, "generation", m.Generation)
	b = kvBin(b, "secret", m.Secret[:])
	return kvBin(b, "token", m.Token[:])
}

func (m *Leave) decode(d *decoder) {
	m.Conversation = d.uint(kConversation)
	m.Participant = d.uint(kParticipant)
	m.Generation = d.uint(kGeneration)
	m.Secret = d.secret(kSecret)
	m.Token = d.token(kToken)
}

func (m *Ping) appendBody(b []byte) []byte { return kvUint(head(b, 2, TypePing), "id", m.ID) }
func (m *Bye) appendBody(b []byte) []byte  { return kvUint(head(b, 2, TypeBye), "id", m.ID) }
