package participanttest

import (
	"bytes"
	"fmt"
	"maps"
	"sort"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
)

// refModel is a reference model of docs/PROTOCOL.md's semantics, written from
// the page and not from the service's decision code: a few maps and slices,
// everything kept in memory, no storage, no reclamation. Connections are
// named by the driver's ints.

// refReq is one request, as the driver issues it to both sides.
type refReq struct {
	kind    string // enroll, attach, tell, ack, detach, leave
	conv    participant.ConversationID
	p       participant.ParticipantID
	gen     participant.Generation
	secret  participant.Secret
	tok     participant.Token
	payload []byte
	through participant.Seq
}

func (q refReq) String() string {
	switch q.kind {
	case "enroll":
		return fmt.Sprintf("enroll(conv=%v tok=%x)", q.conv, q.tok[8:10])
	case "tell":
		return fmt.Sprintf("tell(conv=%v %v %v tok=%x %q)", q.conv, q.p, q.gen, q.tok[8:10], q.payload)
	case "ack":
		return fmt.Sprintf("ack(conv=%v %v %v through=%v)", q.conv, q.p, q.gen, q.through)
	case "attach", "leave":
		return fmt.Sprintf("%s(conv=%v %v %v secret=%x tok=%x)", q.kind, q.conv, q.p, q.gen, q.secret[:3], q.tok[8:10])
	}
	return fmt.Sprintf("%s(conv=%v %v %v tok=%x)", q.kind, q.conv, q.p, q.gen, q.tok[8:10])
}

// refAnswer is an answer in a comparable form: err.code is empty for a
// success. The secret is compared apart, by the driver.
type refAnswer struct {
	err       semWant
	p         participant.ParticipantID
	gen       participant.Generation
	cursor    participant.Seq
	seq       participant.Seq
	replay    participant.Replay
	noop      bool
	expiresMs int64
	secret    participant.Secret // success of enroll/attach only; not compared by ==
}

func (a refAnswer) comparable() refAnswer {
	a.secret = participant.Secret{}
	return a
}

func (a refAnswer) String() string {
	if e := a.err; e.code != "" {
		out := "error " + string(e.code)
		if e.hasGen {
			out += fmt.Sprintf(" generation=%v", e.gen)
		}
		if e.cursor != 0 {
			out += fmt.Sprintf(" cursor=%v", e.cursor)
		}
		if e.limit != 0 {
			out += fmt.Sprintf(" limit=%d", e.limit)
		}
		if e.reason != "" {
			out += fmt.Sprintf(" participant=%v reason=%s", e.participant, e.reason)
		}
		return out
	}
	return fmt.Sprintf("ok{p=%v gen=%v cursor=%v seq=%v replay=%q noop=%v expires=%d}", a.p, a.gen, a.cursor, a.seq, a.replay, a.noop, a.expiresMs)
}

func refErr(code participant.Code) refAnswer { return refAnswer{err: semWant{code: code}} }

type refRecord struct {
	seq     participant.Seq
	kind    participant.RecordKind
	subject participant.ParticipantID
	cause   participant.Cause
	payload []byte
	to      map[participant.ParticipantID]bool
}

// refReceipt is what a committed enroll or attach answered.
type refReceipt struct {
	p       participant.ParticipantID
	gen     participant.Generation
	cursor  participant.Seq
	atMs    int64
	binding int
}

// refDone is a committed participant-scoped token.
type refDone struct {
	kind      string
	payload   []byte
	presented participant.Generation
	seq       participant.Seq
	receipt   *refReceipt
}

type refMember struct {
	gen     participant.Generation
	retired bool
	cursor  participant.Seq
	bound   bool
	conn    int
	binding int
	tokens  map[participant.Token]*refDone
}

type refConv struct {
	members []*refMember
	records []refRecord
	enrolls map[participant.Token]*refReceipt
	// deleted is set once a pass deleted the conversation (every member
	// had left): every request on it is then refused retired.
	deleted bool
}

// allLeft reports whether c had members and every one has left: what
// deletion requires.
func (c *refConv) allLeft() bool {
	for _, mb := range c.members {
		if !mb.retired {
			return false
		}
	}
	return len(c.members) > 0
}

type refCred struct {
	conv participant.ConversationID
	p    participant.ParticipantID
	gen  participant.Generation
}

type refModel struct {
	ttlMs                int64
	maxRecord            int
	maxParticipants      int
	maxConvsPerConn      int
	maxBacklog           int
	convs                map[participant.ConversationID]*refConv
	nextBinding          int
	secrets              map[refCred]participant.Secret
	nowMs                int64
	pendingSecretToLearn []refCred
	// windowMs and skewMs are the token window and skew (0: no window).
	windowMs, skewMs int64
}

func newRefModel(opts participant.Options) *refModel {
	return &refModel{
		ttlMs:           opts.ReceiptTTL.Milliseconds(),
		maxRecord:       opts.MaxRecordBytes,
		maxParticipants: opts.MaxParticipants,
		maxConvsPerConn: opts.MaxConversationsPerConn,
		maxBacklog:      opts.MaxBacklogRecords,
		windowMs:        opts.TokenWindow.Milliseconds(),
		skewMs:          opts.TokenSkew.Milliseconds(),
		convs:           make(map[participant.ConversationID]*refConv),
		secrets:         make(map[refCred]participant.Secret),
	}
}

// clone deep-copies the model, for the two hypotheses of an in_doubt.
func (m *refModel) clone() *refModel {
	n := *m
	n.convs = make(map[participant.ConversationID]*refConv, len(m.convs))
	for id, c := range m.convs {
		nc := &refConv{records: append([]refRecord(nil), c.records...), enrolls: maps.Clone(c.enrolls), deleted: c.deleted}
		for _, mb := range c.members {
			x := *mb
			x.tokens = maps.Clone(mb.tokens)
			nc.members = append(nc.members, &x)
		}
		n.convs[id] = nc
	}
	n.secrets = maps.Clone(m.secrets)
	n.pendingSecretToLearn = nil
	return &n
}

func (m *refModel) member(conv participant.ConversationID, p participant.ParticipantID) *refMember {
	c := m.convs[conv]
	if c == nil || int(p) >= len(c.members) {
		return nil
	}
	return c.members[p]
}

// boundOn returns the participant conn holds bound in conv.
func (m *refModel) boundOn(conv participant.ConversationID, conn int) (participant.ParticipantID, bool) {
	c := m.convs[conv]
	if c == nil {
		return 0, false
	}
	for i, mb := range c.members {
		if mb.bound && mb.conn == conn {
			return participant.ParticipantID(i), true
		}
	}
	return 0, false
}

// connBindings counts the conversations conn holds a binding in.
func (m *refModel) connBindings(conn int) int {
	n := 0
	for id := range m.convs {
		if _, ok := m.boundOn(id, conn); ok {
			n++
		}
	}
	return n
}

func (m *refModel) lastSeq(conv participant.ConversationID) participant.Seq {
	if c := m.convs[conv]; c != nil {
		return participant.Seq(len(c.records))
	}
	return 0
}

// appendRecord adds a record addressed to every member that has not left,
// except its subject.
func (m *refModel) appendRecord(conv participant.ConversationID, kind participant.RecordKind, subject participant.ParticipantID, cause participant.Cause, payload []byte) participant.Seq {
	c := m.convs[conv]
	to := make(map[participant.ParticipantID]bool)
	for i, mb := range c.members {
		if participant.ParticipantID(i) != subject && !mb.retired {
			to[participant.ParticipantID(i)] = true
		}
	}
	seq := participant.Seq(len(c.records) + 1)
	c.records = append(c.records, refRecord{seq: seq, kind: kind, subject: subject, cause: cause, payload: payload, to: to})
	return seq
}

// backlogFull is the per-conversation backlog check (the last before the
// commit) of an operation that adds records to conv: the records from the
// first one some recipient still needs (has neither acknowledged nor
// left) on are retained, and at maxBacklog of them the operation is
// refused, unless it is the attach of participant waiting (a record after
// its cursor is addressed to it), which is refused an eighth past it.
// The server-wide budget is left at its default, which the model never
// reaches.
func (m *refModel) backlogFull(conv participant.ConversationID, waiting *refMember, p participant.ParticipantID) (refAnswer, bool) {
	c := m.convs[conv]
	if c == nil || m.maxBacklog <= 0 {
		return refAnswer{}, false
	}
	first := len(c.records)
	for i, r := range c.records {
		settled := true
		for q := range r.to {
			if mb := c.members[q]; !mb.retired && mb.cursor < r.seq {
				settled = false
				break
			}
		}
		if !settled {
			first = i
			break
		}
	}
	held := len(c.records) - first
	catchUp := false
	if waiting != nil {
		for _, r := range c.records[first:] {
			if r.seq > waiting.cursor && r.to[p] {
				catchUp = true
				break
			}
		}
	}
	if held >= m.maxBacklog+m.maxBacklog/8 || (held >= m.maxBacklog && !catchUp) {
		return refAnswer{err: semWant{code: participant.CodeBacklogFull, limit: uint64(m.maxBacklog)}}, true
	}
	return refAnswer{}, false
}

func (m *refModel) secretOK(conv participant.ConversationID, p participant.ParticipantID, g participant.Generation, s participant.Secret) bool {
	known, ok := m.secrets[refCred{conv, p, g}]
	return ok && known == s
}

// authority checks a generation and, for attach and leave, a secret.
func (m *refModel) authority(q refReq, mb *refMember, withSecret bool) (refAnswer, bool) {
	if withSecret {
		if !m.secretOK(q.conv, q.p, q.gen, q.secret) {
			return refErr(participant.CodeStaleAuthority), false
		}
		if q.gen != mb.gen {
			return refAnswer{err: semWant{code: participant.CodeStaleAuthority, gen: mb.gen, hasGen: true}}, false
		}
		return refAnswer{}, true
	}
	if q.gen != mb.gen {
		return refErr(participant.CodeStaleAuthority), false
	}
	return refAnswer{}, true
}

func (m *refModel) receiptAnswer(q refReq, mb *refMember, rc *refReceipt) refAnswer {
	if mb.gen > rc.gen {
		return refAnswer{err: semWant{code: participant.CodeReceiptExpired, participant: rc.p, gen: mb.gen, hasGen: true, reason: "superseded"}}
	}
	if m.nowMs >= rc.atMs+m.ttlMs {
		return refAnswer{err: semWant{code: participant.CodeReceiptExpired, participant: rc.p, gen: mb.gen, hasGen: true, reason: "deadline"}}
	}
	a := refAnswer{p: rc.p, gen: rc.gen, cursor: rc.cursor, expiresMs: rc.atMs + m.ttlMs, replay: participant.ReplayUnbound}
	a.secret = m.secrets[refCred{q.conv, rc.p, rc.gen}]
	if mb.bound && mb.binding == rc.binding {
		a.replay = participant.ReplayBound
	}
	return a
}

// apply runs request q from connection conn, in docs/PROTOCOL.md's order of
// checks, and commits it when nothing refuses it.
func (m *refModel) apply(q refReq, conn int) refAnswer {
	if c := m.convs[q.conv]; c != nil && c.deleted {
		return refErr(participant.CodeRetired)
	}
	if q.kind == "enroll" {
		return m.enroll(q, conn)
	}
	mb := m.member(q.conv, q.p)
	if mb == nil {
		// A conversation that exists admits the token first.
		if m.convs[q.conv] != nil {
			if a, ok := m.admit(q); !ok {
				return a
			}
		}
		return refErr(participant.CodeUnknownParticipant)
	}
	// 1. the token, whatever the authority: committed, it replays; not,
	// it must pass the token window.
	if q.kind != "ack" {
		if done := mb.tokens[q.tok]; done != nil {
			return m.replay(q, mb, done)
		}
		if a, ok := m.admit(q); !ok {
			return a
		}
	}
	// 3. retired.
	if mb.retired {
		return refErr(participant.CodeRetired)
	}
	// 4. authority.
	if a, ok := m.authority(q, mb, q.kind == "attach" || q.kind == "leave"); !ok {
		return a
	}
	// 5. the binding.
	switch q.kind {
	case "tell", "ack", "detach":
		if !mb.bound || mb.conn != conn {
			return refErr(participant.CodeNoBinding)
		}
	case "leave":
		if mb.bound && mb.conn != conn {
			return refErr(participant.CodeNoBinding)
		}
	}
	switch q.kind {
	case "attach":
		// 6. binding_occupied, 8. capacity.
		other, here := m.boundOn(q.conv, conn)
		if here && other != q.p {
			return refErr(participant.CodeBindingOccupied)
		}
		if !here && m.connBindings(conn) >= m.maxConvsPerConn {
			return refAnswer{err: semWant{code: participant.CodeCapacityExceeded, limit: uint64(m.maxConvsPerConn)}}
		}
		if a, full := m.backlogFull(q.conv, mb, q.p); full {
			return a
		}
		if mb.bound {
			m.appendRecord(q.conv, outbox.KindDetached, q.p, oplog.CauseSuperseded, nil)
		}
		m.appendRecord(q.conv, outbox.KindAttached, q.p, oplog.CauseNone, nil)
		m.nextBinding++
		mb.gen++
		mb.bound, mb.conn, mb.binding = true, conn, m.nextBinding
		rc := &refReceipt{p: q.p, gen: mb.gen, cursor: mb.cursor, atMs: m.nowMs, binding: m.nextBinding}
		mb.tokens[q.tok] = &refDone{kind: "attach", presented: q.gen, receipt: rc}
		m.pendingSecretToLearn = append(m.pendingSecretToLearn, refCred{q.conv, q.p, mb.gen})
		return refAnswer{p: q.p, gen: mb.gen, cursor: mb.cursor, expiresMs: rc.atMs + m.ttlMs}
	case "tell":
		if len(q.payload) > m.maxRecord {
			return refAnswer{err: semWant{code: participant.CodeTooLarge, limit: uint64(m.maxRecord)}}
		}
		if a, full := m.backlogFull(q.conv, nil, q.p); full {
			return a
		}
		seq := m.appendRecord(q.conv, outbox.KindRecord, q.p, oplog.CauseNone, bytes.Clone(q.payload))
		mb.tokens[q.tok] = &refDone{kind: "tell", payload: bytes.Clone(q.payload), seq: seq}
		return refAnswer{seq: seq}
	case "ack":
		switch {
		case q.through < mb.cursor:
			return refAnswer{err: semWant{code: participant.CodeAckRegression, cursor: mb.cursor}}
		case q.through == mb.cursor:
			return refAnswer{p: q.p, cursor: q.through, noop: true}
		}
		c := m.convs[q.conv]
		if int(q.through) > len(c.records) || !c.records[q.through-1].to[q.p] {
			return refAnswer{err: semWant{code: participant.CodeAckGap, cursor: mb.cursor}}
		}
		mb.cursor = q.through
		return refAnswer{p: q.p, cursor: q.through}
	case "detach":
		seq := m.appendRecord(q.conv, outbox.KindDetached, q.p, oplog.CauseClean, nil)
		mb.bound = false
		mb.tokens[q.tok] = &refDone{kind: "detach", seq: seq}
		return refAnswer{p: q.p, seq: seq}
	case "leave":
		seq := m.appendRecord(q.conv, outbox.KindLeft, q.p, oplog.CauseNone, nil)
		mb.bound, mb.retired = false, true
		mb.tokens[q.tok] = &refDone{kind: "leave", seq: seq}
		return refAnswer{p: q.p, seq: seq}
	}
	panic("refModel: unknown request " + q.kind)
}

// admit is the token window's check of a token not found committed:
// token_invalid when it is not a UUIDv7 or is more than the skew ahead of
// the clock, token_expired when it is older than the window. The model's
// runs never retry a token a compaction pass may have forgotten, nor draw
// one below a floor a pass may have persisted (modelRun.retriable), so
// the floor never decides; a floor in the future would refuse what this
// admits.
func (m *refModel) admit(q refReq) (refAnswer, bool) {
	if m.windowMs <= 0 || q.kind == "ack" {
		return refAnswer{}, true
	}
	ms, v7 := tokenTime(q.tok)
	switch {
	case !v7 || ms > m.nowMs+m.skewMs:
		return refErr(participant.CodeTokenInvalid), false
	case ms < m.nowMs-m.windowMs:
		return refErr(participant.CodeTokenExpired), false
	}
	return refAnswer{}, true
}

// unknownEither accepts got for want when q names a participant of a
// conversation the model does not hold: the service answers
// unknown_participant, or, when it holds the conversation's empty state
// (a refused enroll of a pipelined batch loaded it), the token window's
// refusal first. Both are refusals that change nothing.
func (m *refModel) unknownEither(q refReq, got, want refAnswer) bool {
	if want.err.code != participant.CodeUnknownParticipant || m.convs[q.conv] != nil {
		return false
	}
	a, ok := m.admit(q)
	return !ok && got.comparable() == a.comparable()
}

// tokenTime returns the unix ms a UUIDv7 token was drawn at, and whether
// t is a UUIDv7 at all (version 7, variant 10).
func tokenTime(t participant.Token) (int64, bool) {
	if t[6]>>4 != 7 || t[8]>>6 != 0b10 {
		return 0, false
	}
	var ms int64
	for _, b := range t[:6] {
		ms = ms<<8 | int64(b)
	}
	return ms, true
}

func (m *refModel) replay(q refReq, mb *refMember, done *refDone) refAnswer {
	if done.kind != q.kind {
		return refErr(participant.CodeTokenConflict)
	}
	switch q.kind {
	case "tell":
		if !bytes.Equal(done.payload, q.payload) {
			return refErr(participant.CodeTokenConflict)
		}
		return refAnswer{seq: done.seq, replay: participant.ReplayCommitted}
	case "attach":
		if done.presented != q.gen {
			return refErr(participant.CodeTokenConflict)
		}
		if !m.secretOK(q.conv, q.p, q.gen, q.secret) {
			return refErr(participant.CodeStaleAuthority)
		}
		return m.receiptAnswer(q, mb, done.receipt)
	}
	return refAnswer{p: q.p, seq: done.seq, replay: participant.ReplayCommitted}
}

func (m *refModel) enroll(q refReq, conn int) refAnswer {
	c := m.convs[q.conv]
	if c != nil {
		if rc := c.enrolls[q.tok]; rc != nil {
			return m.receiptAnswer(q, c.members[rc.p], rc)
		}
	}
	if a, ok := m.admit(q); !ok {
		return a
	}
	if _, ok := m.boundOn(q.conv, conn); ok {
		return refErr(participant.CodeBindingOccupied)
	}
	if c != nil {
		live := 0
		for _, mb := range c.members {
			if !mb.retired {
				live++
			}
		}
		switch {
		case live >= m.maxParticipants:
			return refAnswer{err: semWant{code: participant.CodeCapacityExceeded, limit: uint64(m.maxParticipants)}}
		case len(c.members) >= 16*m.maxParticipants:
			return refAnswer{err: semWant{code: participant.CodeCapacityExceeded, limit: uint64(16 * m.maxParticipants)}}
		}
	}
	if m.connBindings(conn) >= m.maxConvsPerConn {
		return refAnswer{err: semWant{code: participant.CodeCapacityExceeded, limit: uint64(m.maxConvsPerConn)}}
	}
	if a, full := m.backlogFull(q.conv, nil, 0); full {
		return a
	}
	if c == nil {
		c = &refConv{enrolls: make(map[participant.Token]*refReceipt)}
		m.convs[q.conv] = c
	}
	p := participant.ParticipantID(len(c.members))
	m.appendRecord(q.conv, outbox.KindJoined, p, oplog.CauseNone, nil)
	m.nextBinding++
	c.members = append(c.members, &refMember{gen: 1, bound: true, conn: conn, binding: m.nextBinding, tokens: make(map[participant.Token]*refDone)})
	rc := &refReceipt{p: p, gen: 1, atMs: m.nowMs, binding: m.nextBinding}
	c.enrolls[q.tok] = rc
	m.pendingSecretToLearn = append(m.pendingSecretToLearn, refCred{q.conv, p, 1})
	return refAnswer{p: p, gen: 1, expiresMs: rc.atMs + m.ttlMs}
}

// end ends every binding conn holds, with cause.
func (m *refModel) end(conn int, cause participant.Cause) {
	for _, id := range m.convIDs() {
		if p, ok := m.boundOn(id, conn); ok {
			kind := outbox.KindDetached
			if cause.Died() {
				kind = outbox.KindDied
			}
			m.appendRecord(id, kind, p, cause, nil)
			m.convs[id].members[p].bound = false
		}
	}
}

// restart ends every binding as died/unclean_restart, in participant order.
func (m *refModel) restart() {
	for _, id := range m.convIDs() {
		for i, mb := range m.convs[id].members {
			if mb.bound {
				m.appendRecord(id, outbox.KindDied, participant.ParticipantID(i), oplog.CauseUncleanRestart, nil)
				mb.bound = false
			}
		}
	}
}

func (m *refModel) convIDs() []participant.ConversationID {
	ids := make([]participant.ConversationID, 0, len(m.convs))
	for id := range m.convs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// deliveries returns what conn must be offered in conv from the durable
// cursor: the records addressed to the participant it holds bound there,
// after its cursor, ascending.
func (m *refModel) deliveries(conv participant.ConversationID, conn int) (participant.ParticipantID, participant.Generation, []refRecord, bool) {
	p, ok := m.boundOn(conv, conn)
	if !ok {
		return 0, 0, nil, false
	}
	mb := m.convs[conv].members[p]
	var out []refRecord
	for _, r := range m.convs[conv].records {
		if r.seq > mb.cursor && r.to[p] {
			out = append(out, r)
		}
	}
	return p, mb.gen, out, true
}
