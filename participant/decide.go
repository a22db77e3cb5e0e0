package participant

import (
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// The decision code: pure functions from a conversation's state and a
// request to a refusal or the oplog row to commit. They check in
// docs/PROTOCOL.md's order (after the token, which the driver resolves first):
// for enroll under EnrollInvite, invite_required and invite_invalid; then
// unknown_participant, retired, stale_authority, no_binding,
// binding_occupied, operation checks, capacity_exceeded (participants,
// connection bindings, store size; then, for an enroll that creates its
// conversation, the client's creation rate and the conversations, which
// the driver checks and reserves last); then, for enroll, tell and attach, the driver's
// backlog_full (backpressure.go).

// decider carries what the decisions need besides state and request.
type decider struct {
	key             []byte
	conv            ConversationID
	conn            ConnID
	now             time.Time
	maxRecordBytes  int
	maxParticipants int
	// connBindings is how many conversations the connection is bound in,
	// and maxConnBindings its cap.
	connBindings    int
	maxConnBindings int
	// requireInvite is set under EnrollInvite.
	requireInvite bool
	// restoredFrom is Options.RestoredFrom.
	restoredFrom string
	// dataBytes reports the store's bytes in use, checked against
	// maxDataBytes by the operations that add data (enroll, tell); nil
	// means no cap.
	dataBytes    func() int64
	maxDataBytes int64
}

// dataCapacity refuses an operation that adds data once the store's bytes
// in use reached their cap, saying how they come down again.
func (d *decider) dataCapacity() *Error {
	if d.dataBytes == nil || d.maxDataBytes <= 0 {
		return nil
	}
	if n := d.dataBytes(); n >= d.maxDataBytes {
		e := refuse(CodeCapacityExceeded, "the store holds %d bytes in use, the limit is %d: "+
			"records go once every recipient acknowledged them (or left, or they are older than the unacknowledged-record age bound) "+
			"and compaction removed them after the retention period; or raise the limit", n, d.maxDataBytes)
		e.Limit = uint64(d.maxDataBytes)
		return e
	}
	return nil
}

func (d *decider) at() int64 { return d.now.UnixMilli() }

// boundHere returns the participant bound on d.conn in st, if any.
func (d *decider) boundHere(st *outbox.State) (ParticipantID, bool) {
	for i := range st.Members {
		if m := &st.Members[i]; m.Bound && m.Conn == d.conn {
			return ParticipantID(i), true
		}
	}
	return 0, false
}

// member runs checks 2 and 3: the participant exists and has not left.
func member(st *outbox.State, p ParticipantID) (*outbox.Member, *Error) {
	m := st.Member(p)
	if m == nil || st.Applied == 0 {
		return nil, refuse(CodeUnknownParticipant, "no participant %v", p)
	}
	if m.Retired {
		return nil, refuse(CodeRetired, "participant %v has left", p)
	}
	return m, nil
}

// authority runs check 4 for requests that present a generation and, when
// secret is non-nil, a secret.
func (d *decider) authority(st *outbox.State, p ParticipantID, m *outbox.Member, g Generation, secret *Secret) *Error {
	if secret == nil {
		if g != m.Generation {
			return refuse(CodeStaleAuthority, "generation %v is not the current one", g)
		}
		return nil
	}
	if !verifySecret(d.key, st.Nonce, d.conv, p, g, *secret) {
		return refuse(CodeStaleAuthority, "the secret does not verify for %v", g)
	}
	if g != m.Generation {
		e := refuse(CodeStaleAuthority, "generation %v is not the current one", g)
		if g > m.Generation {
			// The secret verifies, so this server minted g: only data
			// that went back in time holds an older generation.
			e = newerThanData(g, m.Generation, d.restoredFrom)
		}
		e.Generation, e.HasGeneration = m.Generation, true
		return e
	}
	return nil
}

// newerThanData refuses a credential at generation g, whose secret
// verifies, by data whose participant is at the older generation current:
// the data lost what happened since, as after a restore from a backup
// taken before g was minted.
func newerThanData(g, current Generation, restoredFrom string) *Error {
	from := "a backup"
	if restoredFrom != "" {
		from = "a backup (" + restoredFrom + ")"
	}
	return refuse(CodeStaleAuthority, "generation %v is newer than the data, which holds %v: the data was restored from %s older than this credential, "+
		"or lost its latest writes; the credential cannot attach again, enroll anew (docs/operations.md, Backups)", g, current, from)
}

// binding runs check 5: the request comes from the connection holding p's
// binding.
func (d *decider) binding(p ParticipantID, m *outbox.Member) *Error {
	if !m.Bound || m.Conn != d.conn {
		return refuse(CodeNoBinding, "this connection does not hold the binding of %v", p)
	}
	return nil
}

func (d *decider) enroll(st *outbox.State, req *Enroll) (oplog.Row, *Error) {
	var grant inviteGrant
	if d.requireInvite {
		var e *Error
		if grant, e = verifyInvite(d.key, d.conv, d.now, req.Invite); e != nil {
			return oplog.Row{}, e
		}
		if used := st.InviteUses[grant.id]; grant.uses > 0 && used >= grant.uses {
			return oplog.Row{}, refuse(CodeInviteInvalid, "the invitation admitted %d enrolls, all it allows", used)
		}
	}
	if _, ok := d.boundHere(st); ok {
		return oplog.Row{}, refuse(CodeBindingOccupied, "this connection already holds a binding in conversation %v", d.conv)
	}
	if e := d.participantCapacity(st); e != nil {
		return oplog.Row{}, e
	}
	if e := d.connCapacity(); e != nil {
		return oplog.Row{}, e
	}
	if e := d.dataCapacity(); e != nil {
		return oplog.Row{}, e
	}
	return oplog.Row{
		Kind:        oplog.KindEnroll,
		Participant: ParticipantID(len(st.Members)),
		Generation:  1,
		Token:       req.Token,
		Conn:        d.conn,
		Seq:         st.LastSeq + 1,
		At:          d.at(),
		// The use is spent by this row, which commits with the token.
		Payload: grant.payload(),
	}, nil
}

// mintedPerSlot is how many participant ids a conversation mints, at
// most, per slot of MaxParticipants.
const mintedPerSlot = 16

// participantCapacity refuses an enroll into a conversation whose members
// who have not left fill MaxParticipants. A participant who left frees its
// slot but keeps its id (ids are never reused, and its committed answers
// still replay by token), and a member costs its state whether it left or
// not; so the ids a conversation mints are capped too, at mintedPerSlot
// times MaxParticipants, which an enroll-and-leave churn reaches only after
// that many operations.
func (d *decider) participantCapacity(st *outbox.State) *Error {
	live := 0
	for i := range st.Members {
		if !st.Members[i].Retired {
			live++
		}
	}
	if live >= d.maxParticipants {
		e := refuse(CodeCapacityExceeded, "conversation %v has %d participants who have not left", d.conv, live)
		e.Limit = uint64(d.maxParticipants)
		return e
	}
	if minted := mintedPerSlot * d.maxParticipants; len(st.Members) >= minted {
		e := refuse(CodeCapacityExceeded, "conversation %v minted %d participant ids, the most it may", d.conv, len(st.Members))
		e.Limit = uint64(minted)
		return e
	}
	return nil
}

func (d *decider) connCapacity() *Error {
	if d.connBindings >= d.maxConnBindings {
		e := refuse(CodeCapacityExceeded, "this connection holds %d bindings", d.connBindings)
		e.Limit = uint64(d.maxConnBindings)
		return e
	}
	return nil
}

func (d *decider) attach(st *outbox.State, req *Attach) (oplog.Row, *Error) {
	m, e := member(st, req.Participant)
	if e != nil {
		return oplog.Row{}, e
	}
	if e := d.authority(st, req.Participant, m, req.Generation, &req.Secret); e != nil {
		return oplog.Row{}, e
	}
	other, here := d.boundHere(st)
	if here && other != req.Participant {
		return oplog.Row{}, refuse(CodeBindingOccupied, "this connection holds the binding of %v in conversation %v", other, d.conv)
	}
	if !here {
		if e := d.connCapacity(); e != nil {
			return oplog.Row{}, e
		}
	}
	records := Seq(1)
	if m.Bound {
		records = 2 // detached/superseded, then attached
	}
	return oplog.Row{
		Kind:        oplog.KindAttach,
		Participant: req.Participant,
		Generation:  m.Generation + 1,
		Token:       req.Token,
		Conn:        d.conn,
		Cursor:      m.Cursor,
		Seq:         st.LastSeq + records,
		At:          d.at(),
	}, nil
}

func (d *decider) tell(st *outbox.State, req *Tell) (oplog.Row, *Error) {
	m, e := member(st, req.Participant)
	if e != nil {
		return oplog.Row{}, e
	}
	if e := d.authority(st, req.Participant, m, req.Generation, nil); e != nil {
		return oplog.Row{}, e
	}
	if e := d.binding(req.Participant, m); e != nil {
		return oplog.Row{}, e
	}
	if len(req.Payload) > d.maxRecordBytes {
		e := refuse(CodeTooLarge, "payload of %d bytes", len(req.Payload))
		e.Limit = uint64(d.maxRecordBytes)
		return oplog.Row{}, e
	}
	if e := d.dataCapacity(); e != nil {
		return oplog.Row{}, e
	}
	return oplog.Row{
		Kind:        oplog.KindTell,
		Participant: req.Participant,
		Generation:  req.Generation,
		Token:       req.Token,
		Seq:         st.LastSeq + 1,
		At:          d.at(),
		Payload:     req.Payload, // the caller's, not to be modified (Tell)
	}, nil
}

// ack returns the row to commit, or noop set when through is the cursor.
func (d *decider) ack(st *outbox.State, req *Ack) (row oplog.Row, noop bool, e *Error) {
	m, e := member(st, req.Participant)
	if e != nil {
		return row, false, e
	}
	if e := d.authority(st, req.Participant, m, req.Generation, nil); e != nil {
		return row, false, e
	}
	if e := d.binding(req.Participant, m); e != nil {
		return row, false, e
	}
	switch {
	case req.Through < m.Cursor:
		e := refuse(CodeAckRegression, "through %v is below the cursor %v", req.Through, m.Cursor)
		e.Cursor = m.Cursor
		return row, false, e
	case req.Through == m.Cursor:
		return row, true, nil
	}
	if req.Through <= m.Released {
		e := refuse(CodeCompacted, "records through %v were released unacknowledged", m.Released)
		e.First = m.Released + 1
		return row, false, e
	}
	if rec, ok := st.Record(req.Through); !ok || !rec.Addressed(req.Participant) {
		e := refuse(CodeAckGap, "%v is not a record addressed to %v", req.Through, req.Participant)
		e.Cursor = m.Cursor
		return row, false, e
	}
	return oplog.Row{
		Kind:        oplog.KindAck,
		Participant: req.Participant,
		Generation:  req.Generation,
		Through:     req.Through,
		At:          d.at(),
	}, false, nil
}

func (d *decider) detach(st *outbox.State, req *Detach) (oplog.Row, *Error) {
	m, e := member(st, req.Participant)
	if e != nil {
		return oplog.Row{}, e
	}
	if e := d.authority(st, req.Participant, m, req.Generation, nil); e != nil {
		return oplog.Row{}, e
	}
	if e := d.binding(req.Participant, m); e != nil {
		return oplog.Row{}, e
	}
	return oplog.Row{
		Kind:        oplog.KindDetach,
		Participant: req.Participant,
		Generation:  req.Generation,
		Token:       req.Token,
		Conn:        m.Conn,
		Seq:         st.LastSeq + 1,
		At:          d.at(),
	}, nil
}

func (d *decider) leave(st *outbox.State, req *Leave) (oplog.Row, *Error) {
	m, e := member(st, req.Participant)
	if e != nil {
		return oplog.Row{}, e
	}
	if e := d.authority(st, req.Participant, m, req.Generation, &req.Secret); e != nil {
		return oplog.Row{}, e
	}
	if m.Bound {
		if e := d.binding(req.Participant, m); e != nil {
			return oplog.Row{}, e
		}
	}
	return oplog.Row{
		Kind:        oplog.KindLeave,
		Participant: req.Participant,
		Generation:  req.Generation,
		Token:       req.Token,
		Conn:        m.Conn,
		Seq:         st.LastSeq + 1,
		At:          d.at(),
	}, nil
}

// end returns the row ending p's binding on conn with cause, or false when
// p holds no binding there (it ended already).
func end(st *outbox.State, p ParticipantID, conn ConnID, cause Cause, now time.Time) (oplog.Row, bool) {
	m := st.Member(p)
	if m == nil || !m.Bound || m.Conn != conn {
		return oplog.Row{}, false
	}
	return oplog.Row{
		Kind:        oplog.KindEnd,
		Participant: p,
		Generation:  m.Generation,
		Conn:        conn,
		Cause:       cause,
		Seq:         st.LastSeq + 1,
		At:          now.UnixMilli(),
	}, true
}

// replay answers a request whose token already committed prior. It never
// re-checks authority (a client may retry after its generation moved on),
// except that an attach's secret must verify for the generation it
// presented and, under EnrollInvite, an enroll must present an invitation
// to the conversation again: the answer holds the participant's secret, so
// the token alone must not be enough to get it. The returned error is
// invite_required, invite_invalid, token_conflict, stale_authority or
// receipt_expired.
type replayer struct {
	key  []byte
	conv ConversationID
	now  time.Time
	ttl  time.Duration
	// requireInvite is set under EnrollInvite.
	requireInvite bool
}

// bound answers a replayed enroll or attach from its row.
func (r *replayer) bound(st *outbox.State, pr *prior) (Bound, *Error) {
	row := &pr.row
	m := st.Member(row.Participant)
	expires := time.UnixMilli(row.At).Add(r.ttl)
	switch {
	case m.Generation > row.Generation:
		return Bound{}, r.expired(row.Participant, m, "superseded")
	case !r.now.Before(expires):
		return Bound{}, r.expired(row.Participant, m, "deadline")
	}
	b := boundAnswer(r.key, st.Nonce, r.conv, row, r.ttl)
	b.Replay = ReplayUnbound
	if m.Bound && m.BindingSource == pr.idx {
		b.Replay = ReplayBound
	}
	return b, nil
}

// boundAnswer is the answer of the enroll or attach that committed row:
// the same whether it is given fresh or replayed.
func boundAnswer(key []byte, nonce [16]byte, c ConversationID, row *oplog.Row, ttl time.Duration) Bound {
	return Bound{
		Conversation:     c,
		Participant:      row.Participant,
		Generation:       row.Generation,
		Secret:           deriveSecret(key, nonce, c, row.Participant, row.Generation),
		Cursor:           row.Cursor,
		ReceiptExpiresAt: time.UnixMilli(row.At).Add(ttl),
	}
}

func (r *replayer) expired(p ParticipantID, m *outbox.Member, reason string) *Error {
	e := refuse(CodeReceiptExpired, "the answer's secret is no longer replayed (%s)", reason)
	e.Participant, e.Generation, e.HasGeneration, e.Reason = p, m.Generation, true, reason
	return e
}

func conflict(kind oplog.Kind) *Error {
	return refuse(CodeTokenConflict, "the token committed a different %v", kind)
}

// enroll answers a replayed enroll. Under EnrollInvite the invitation is
// checked first, so that a request without one learns nothing of the
// token, not even what it committed. It is checked at the commit's time,
// not now: a retry repeats its request unchanged, so an invitation that
// admitted the enroll admits its replays for the receipt's lifetime, even
// once expired.
func (r *replayer) enroll(st *outbox.State, pr *prior, req *Enroll) (Bound, *Error) {
	if r.requireInvite {
		if e := checkInvite(r.key, r.conv, time.UnixMilli(pr.row.At), req.Invite); e != nil {
			return Bound{}, e
		}
	}
	if pr.row.Kind != oplog.KindEnroll {
		return Bound{}, conflict(pr.row.Kind)
	}
	return r.bound(st, pr)
}

func (r *replayer) attach(st *outbox.State, pr *prior, req *Attach) (Bound, *Error) {
	if pr.row.Kind != oplog.KindAttach || pr.row.Generation != req.Generation+1 {
		return Bound{}, conflict(pr.row.Kind)
	}
	if !verifySecret(r.key, st.Nonce, r.conv, req.Participant, req.Generation, req.Secret) {
		return Bound{}, refuse(CodeStaleAuthority, "the secret does not verify for %v", req.Generation)
	}
	return r.bound(st, pr)
}

func (r *replayer) tell(pr *prior, req *Tell) (Told, *Error) {
	if pr.row.Kind != oplog.KindTell || !pr.samePayload(req.Payload) {
		return Told{}, conflict(pr.row.Kind)
	}
	return Told{Conversation: r.conv, Seq: pr.row.Seq, Replay: ReplayCommitted}, nil
}

func (r *replayer) ended(pr *prior, kind oplog.Kind) (Ended, *Error) {
	if pr.row.Kind != kind {
		return Ended{}, conflict(pr.row.Kind)
	}
	return Ended{Conversation: r.conv, Participant: pr.row.Participant, Seq: pr.row.Seq, Replay: ReplayCommitted}, nil
}
