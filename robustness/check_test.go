package robustness_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store/etcdstore"
)

// Violation is one broken promise, named by the invariant it breaks.
type Violation struct {
	Invariant string `json:"invariant"`
	Detail    string `json:"detail"`
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// Invariants, the promises of README.md and docs/PROTOCOL.md that a
// history is checked against.
const (
	InvAnsweredOnce   = "answered-present-once"    // every answered tell is in the log exactly once, at its seq
	InvNoDoubleCommit = "never-committed-twice"    // no payload (one token) is in the log twice
	InvRetryReplays   = "retry-replays"            // every answer of one token names the same seq
	InvRefusedNotDone = "refused-means-not-done"   // a token refused on an attempt is not in the log
	InvKeepsBinding   = "writer-keeps-binding"     // a client never loses a participant only it uses
	InvNoFork         = "stream-never-forks"       // seqs run 1, 2, ... with no gap or repeat
	InvBindingsEnd    = "bindings-end-once"        // a binding ends at most once, after it began
	InvLoadable       = "conversations-loadable"   // every conversation loads, nothing to repair
	InvReaderOrdered  = "reader-in-order"          // a reader's deliveries have increasing seqs
	InvReaderMatches  = "reader-sees-the-log"      // a delivered record is the log's record at its seq
	InvReaderComplete = "reader-gets-everything"   // every record addressed to a reader is delivered
	InvNodeAlive      = "node-never-crashes"       // no node process ends by itself
	InvNodeRestarts   = "killed-node-restarts"     // a killed node starts again (its id's old lease expiring meanwhile)
	InvRestore        = "restore-is-the-backup"    // a restored data set serves what was backed up
	InvTooLargeFinal  = "too-large-is-final"       // a tell over max_record_bytes is refused too_large, never in doubt
	InvNotStuck       = "no-call-past-its-context" // no call returns long after its context ended
	InvDetachHolds    = "detached-stays-detached"  // an answered detach is in the log, and no attach of its participant follows it
)

// stuckGrace is how long past its context (callTimeout) a call may take
// to return: the end of an attempt in flight.
const stuckGrace = 5 * time.Second

// tellRow is one committed tell of the log.
type tellRow struct {
	seq         uint64
	token       string
	payload     string
	participant uint64
}

// convLog is one conversation as etcd holds it at the end of a run.
type convLog struct {
	tells   []tellRow
	records []outbox.Record
}

// readLogs reads every conversation of convs under prefix at etcd's
// current revision, through the offline tools' read-only view, and checks
// that each loads (Inspect refuses none).
func readLogs(ctx context.Context, cli *clientv3.Client, prefix string, convs []uint64) (map[uint64]*convLog, []Violation, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, nil, err
	}
	view := cluster.OpenView(etcdstore.AtRevision(cli.KV, resp.Header.Revision), prefix)
	defer view.Close()
	var vs []Violation
	reports, err := participant.Inspect(view)
	if err != nil {
		return nil, nil, fmt.Errorf("inspect: %w", err)
	}
	for _, r := range reports {
		if r.Refused != nil {
			vs = append(vs, Violation{InvLoadable, fmt.Sprintf("conversation %v is unloadable: %+v", r.Conversation, r.Refused)})
		}
	}
	logs := make(map[uint64]*convLog)
	for _, c := range convs {
		id := participant.ConversationID(c)
		l := &convLog{}
		entries, err := view.ReadFrom(oplog.Stream(id), 0, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("oplog of %d: %w", c, err)
		}
		for _, e := range entries {
			row, err := oplog.Decode(e.Payload)
			if err != nil {
				return nil, nil, fmt.Errorf("oplog of %d at %d: %w", c, e.Seq, err)
			}
			if row.Kind == oplog.KindTell {
				l.tells = append(l.tells, tellRow{seq: uint64(row.Seq), token: hex.EncodeToString(row.Token[:]),
					payload: string(row.Payload), participant: uint64(row.Participant)})
			}
		}
		rows, _, err := participanttest.StoredOutbox(view, id)
		if err != nil {
			return nil, nil, fmt.Errorf("outbox of %d: %w", c, err)
		}
		for _, row := range rows {
			l.records = append(l.records, row.Records...)
		}
		logs[c] = l
	}
	return logs, vs, nil
}

// checkHistory judges the clients' history against the logs.
func checkHistory(ops []Op, deliveries []Delivery, logs map[uint64]*convLog) []Violation {
	var vs []Violation
	add := func(inv, format string, args ...any) { vs = append(vs, Violation{inv, fmt.Sprintf(format, args...)}) }

	// The log, indexed.
	type at struct {
		conv uint64
		row  tellRow
	}
	byToken := map[string][]at{}
	byPayload := map[string][]at{}
	bySeq := map[uint64]map[uint64]tellRow{}
	for c, l := range logs {
		bySeq[c] = map[uint64]tellRow{}
		for _, r := range l.tells {
			byToken[r.token] = append(byToken[r.token], at{c, r})
			byPayload[r.payload] = append(byPayload[r.payload], at{c, r})
			bySeq[c][r.seq] = r
		}
	}
	for p, rows := range byPayload {
		if len(rows) > 1 {
			seqs := make([]string, len(rows))
			for i, r := range rows {
				seqs[i] = fmt.Sprintf("seq %d (token %s)", r.row.seq, r.row.token)
			}
			add(InvNoDoubleCommit, "payload %q committed %d times: %s", p, len(rows), strings.Join(seqs, ", "))
		}
	}

	// A lost participant, once per participant: every later call on it
	// fails the same way.
	type who struct {
		client      string
		participant uint64
	}
	lost := map[who]int{}
	var lostOrder []Op
	for _, op := range ops {
		if op.Outcome == Lost {
			k := who{op.Client, op.Participant}
			if lost[k] == 0 {
				lostOrder = append(lostOrder, op)
			}
			lost[k]++
		}
	}
	for _, op := range lostOrder {
		add(InvKeepsBinding, "%s lost its participant %d of conversation %d on a %s (%q, token %s, attempt %d, at %d ms; %d calls failed so): %s",
			op.Client, op.Participant, op.Conversation, op.Kind, op.Payload, op.Token, op.Attempt, op.Start, lost[who{op.Client, op.Participant}], op.Err)
	}

	// Per token: its attempts in order.
	attempts := map[string][]Op{}
	var tokens []string
	for _, op := range ops {
		if op.Kind != "tell" && op.Kind != "replay" {
			continue
		}
		if _, ok := attempts[op.Token]; !ok {
			tokens = append(tokens, op.Token)
		}
		attempts[op.Token] = append(attempts[op.Token], op)
	}
	for _, tok := range tokens {
		as := attempts[tok]
		committed := byToken[tok]
		var answered []Op
		for _, a := range as {
			switch a.Outcome {
			case Answered:
				answered = append(answered, a)
			case Refused:
				// A committed token replays, however old, until the
				// server forgets it once the token window passed
				// (PROTOCOL.md, Token window): a replay at the end of a
				// long run may be token_expired, and nothing else.
				if len(committed) > 0 && (a.Kind == "tell" || a.Code != string(client.CodeTokenExpired)) {
					add(InvRefusedNotDone, "%s's %s %q (token %s) was refused on attempt %d at %d ms (%s) but is committed at seq %d", a.Client, a.Kind, a.Payload, tok, a.Attempt, a.Start, a.Err, committed[0].row.seq)
				}
			}
		}
		for _, a := range answered {
			if a.Seq != answered[0].Seq {
				add(InvRetryReplays, "token %s (%q) answered seq %d (%s attempt %d, at %d ms) and seq %d (%s attempt %d, at %d ms)",
					tok, a.Payload, answered[0].Seq, answered[0].Kind, answered[0].Attempt, answered[0].Start, a.Seq, a.Kind, a.Attempt, a.Start)
			}
		}
		if len(answered) == 0 {
			continue
		}
		a := answered[0]
		switch {
		case len(committed) == 0:
			add(InvAnsweredOnce, "%s's %q (token %s) was answered seq %d at %d ms but is not in conversation %d's log", a.Client, a.Payload, tok, a.Seq, a.End, a.Conversation)
		case len(committed) > 1:
			add(InvAnsweredOnce, "%s's %q (token %s) is in the log %d times", a.Client, a.Payload, tok, len(committed))
		case committed[0].conv != a.Conversation || committed[0].row.seq != a.Seq || committed[0].row.payload != a.Payload:
			add(InvAnsweredOnce, "%s's %q (token %s) was answered seq %d of conversation %d; the log has %q at seq %d of conversation %d",
				a.Client, a.Payload, tok, a.Seq, a.Conversation, committed[0].row.payload, committed[0].row.seq, committed[0].conv)
		}
	}

	vs = append(vs, checkClientAnswers(ops, logs)...)

	// The streams.
	for c, l := range logs {
		vs = append(vs, checkRecords(c, l.records)...)
	}

	// The readers.
	type rkey struct {
		reader string
		conv   uint64
	}
	got := map[rkey][]Delivery{}
	recipient := map[rkey]uint64{}
	for _, d := range deliveries {
		k := rkey{d.Reader, d.Conversation}
		got[k] = append(got[k], d)
		recipient[k] = d.Recipient
	}
	for _, op := range ops {
		if op.Kind == "enroll" && op.Outcome == Answered && strings.HasPrefix(op.Client, "reader") {
			recipient[rkey{op.Client, op.Conversation}] = op.Participant
		}
	}
	keys := make([]rkey, 0, len(recipient))
	for k := range recipient {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].reader < keys[j].reader })
	for _, k := range keys {
		l := logs[k.conv]
		if l == nil {
			continue
		}
		ds := got[k]
		delivered := map[uint64]bool{}
		var last uint64
		for _, d := range ds {
			if d.Seq <= last {
				add(InvReaderOrdered, "%s got seq %d after seq %d (at %d ms)", k.reader, d.Seq, last, d.At)
			}
			last = max(last, d.Seq)
			delivered[d.Seq] = true
			if d.Kind == outbox.KindRecord.String() {
				r, ok := bySeq[k.conv][d.Seq]
				if !ok || r.payload != d.Payload {
					add(InvReaderMatches, "%s got %q at seq %d (at %d ms); the log has %q there", k.reader, d.Payload, d.Seq, d.At, r.payload)
				}
			}
		}
		if missing := undelivered(l, recipient[k], delivered); len(missing) > 0 {
			lastAt := int64(-1)
			if len(ds) > 0 {
				lastAt = ds[len(ds)-1].At
			}
			add(InvReaderComplete, "%s (participant %d of conversation %d) never got %d of the records addressed to it: seqs %s; its last delivery was seq %d at %d ms",
				k.reader, recipient[k], k.conv, len(missing), seqRanges(missing), last, lastAt)
		}
	}
	return vs
}

// undelivered returns, in order, the seqs of l's records addressed to
// participant p that are not in delivered.
func undelivered(l *convLog, p uint64, delivered map[uint64]bool) []uint64 {
	var out []uint64
	for _, rec := range l.records {
		if slices.Contains(rec.Recipients, oplog.ParticipantID(p)) && !delivered[uint64(rec.Seq)] {
			out = append(out, uint64(rec.Seq))
		}
	}
	return out
}

// checkRecords checks conversation c's record stream: seqs from 1 without
// gap or repeat, and each binding ends at most once, after it began (the
// rule of participanttest.CheckRecords, reported rather than fatal).
func checkRecords(c uint64, recs []outbox.Record) []Violation {
	var vs []Violation
	next := oplog.Seq(1)
	bound := map[oplog.ParticipantID]bool{}
	for _, rec := range recs {
		if rec.Seq != next {
			vs = append(vs, Violation{InvNoFork, fmt.Sprintf("conversation %d: record seq %d where %d was due", c, rec.Seq, next)})
			next = rec.Seq
		}
		next++
		p := rec.Participant
		switch rec.Kind {
		case outbox.KindJoined, outbox.KindAttached:
			if bound[p] {
				vs = append(vs, Violation{InvBindingsEnd, fmt.Sprintf("conversation %d: participant %d bound again at seq %d while its binding was live", c, p, rec.Seq)})
			}
			bound[p] = true
		case outbox.KindDetached, outbox.KindDied:
			if !bound[p] {
				vs = append(vs, Violation{InvBindingsEnd, fmt.Sprintf("conversation %d: participant %d's binding ended twice, or before it began, at seq %d", c, p, rec.Seq)})
			}
			bound[p] = false
		case outbox.KindLeft:
			bound[p] = false
		}
	}
	return vs
}

// seqRanges renders sorted seqs as "3-7, 9".
func seqRanges(seqs []uint64) string {
	var parts []string
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(seqs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", seqs[i], seqs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// checkClientAnswers judges what the clients told the writers beyond the
// tells (docs/clients.md, What a client's answers promise): an oversized
// tell is refused too_large at once; no call outlives its context by
// more than stuckGrace; an answered detach is the log's detached record
// of its participant at its seq, and no attach of that participant
// follows it (no automatic re-attach undid it).
func checkClientAnswers(ops []Op, logs map[uint64]*convLog) []Violation {
	var vs []Violation
	add := func(inv, format string, args ...any) { vs = append(vs, Violation{inv, fmt.Sprintf(format, args...)}) }
	for _, op := range ops {
		if d := time.Duration(op.End-op.Start) * time.Millisecond; d > callTimeout+stuckGrace {
			add(InvNotStuck, "%s's %s (token %s) took %v, past its context's %v", op.Client, op.Kind, op.Token, d, callTimeout)
		}
		switch op.Kind {
		case "oversized":
			if op.Outcome != Refused || op.Code != string(client.CodeTooLarge) {
				add(InvTooLargeFinal, "%s's %s (token %s) = %s %s, want refused too_large", op.Client, op.Payload, op.Token, op.Outcome, op.Err)
			}
		case "detach":
			if op.Outcome != Answered {
				continue
			}
			l := logs[op.Conversation]
			if l == nil {
				continue
			}
			found := false
			for _, r := range l.records {
				if uint64(r.Participant) != op.Participant {
					continue
				}
				if uint64(r.Seq) == op.Seq && r.Kind == outbox.KindDetached {
					found = true
				}
				if uint64(r.Seq) > op.Seq && r.Kind == outbox.KindAttached {
					add(InvDetachHolds, "%s's detach of participant %d was answered seq %d, and the participant was attached again at seq %d", op.Client, op.Participant, op.Seq, r.Seq)
				}
			}
			if !found {
				add(InvDetachHolds, "%s's detach of participant %d was answered seq %d, which is not its detached record in conversation %d's log", op.Client, op.Participant, op.Seq, op.Conversation)
			}
		}
	}
	return vs
}
