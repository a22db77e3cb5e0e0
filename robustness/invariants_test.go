package robustness_test

import (
	"slices"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
)

// A consistent run, in the smallest: reader r (participant 2) joins
// conversation 1, writer w (participant 1) joins and tells "w/1" at seq 3,
// and replays it at the end; r gets seqs 2 and 3.
func consistentRun() ([]Op, []Delivery, map[uint64]*convLog) {
	ops := []Op{
		{Client: "reader-1", Kind: "enroll", Conversation: 1, Participant: 2, Outcome: Answered},
		{Client: "writer-1", Kind: "enroll", Conversation: 1, Participant: 1, Outcome: Answered},
		{Client: "writer-1", Kind: "tell", Conversation: 1, Participant: 1, Token: "aa", Payload: "w/1", Attempt: 1, Outcome: Answered, Seq: 3},
		{Client: "writer-1", Kind: "replay", Conversation: 1, Participant: 1, Token: "aa", Payload: "w/1", Outcome: Answered, Seq: 3},
	}
	dels := []Delivery{
		{Reader: "reader-1", Conversation: 1, Recipient: 2, Seq: 2, Kind: "joined", Participant: 1},
		{Reader: "reader-1", Conversation: 1, Recipient: 2, Seq: 3, Kind: "record", Participant: 1, Payload: "w/1"},
	}
	logs := map[uint64]*convLog{1: {
		tells: []tellRow{{seq: 3, token: "aa", payload: "w/1", participant: 1}},
		records: []outbox.Record{
			{Seq: 1, Kind: outbox.KindJoined, Participant: 2},
			{Seq: 2, Kind: outbox.KindJoined, Participant: 1, Recipients: []oplog.ParticipantID{2}},
			{Seq: 3, Kind: outbox.KindRecord, Participant: 1, Recipients: []oplog.ParticipantID{2}},
		},
	}}
	return ops, dels, logs
}

// TestCheckHistory_EachInvariantCanFail: the checker passes a consistent
// run, and names the invariant that each broken run breaks. A checker
// whose condition cannot be false would pass every seed.
func TestCheckHistory_EachInvariantCanFail(t *testing.T) {
	ops, dels, logs := consistentRun()
	if vs := checkHistory(ops, dels, logs); len(vs) != 0 {
		t.Fatalf("a consistent run: %v, want no violation", vs)
	}
	type change func(ops *[]Op, dels *[]Delivery, l *convLog)
	for _, tc := range []struct {
		what   string
		change change
		want   string // "" for none
	}{
		{"the answered tell is not in the log", func(_ *[]Op, _ *[]Delivery, l *convLog) { l.tells = nil }, InvAnsweredOnce},
		{"the log holds another payload", func(ops *[]Op, _ *[]Delivery, _ *convLog) { (*ops)[2].Payload = "w/2" }, InvAnsweredOnce},
		{"a payload committed twice", func(_ *[]Op, _ *[]Delivery, l *convLog) {
			l.tells = append(l.tells, tellRow{seq: 4, token: "bb", payload: "w/1", participant: 1})
		}, InvNoDoubleCommit},
		{"the replay answers another seq", func(ops *[]Op, _ *[]Delivery, _ *convLog) { (*ops)[3].Seq = 4 }, InvRetryReplays},
		{"a retry of the committed tell refused", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			*ops = append(*ops, Op{Client: "writer-1", Kind: "tell", Conversation: 1, Participant: 1, Token: "aa", Payload: "w/1", Attempt: 2,
				Outcome: Refused, Code: string(client.CodeTokenExpired)})
		}, InvRefusedNotDone},
		{"the replay refused token_conflict", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			(*ops)[3].Outcome, (*ops)[3].Code = Refused, string(client.CodeTokenConflict)
		}, InvRefusedNotDone},
		{"the replay refused token_expired, the window passed", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			(*ops)[3].Outcome, (*ops)[3].Code = Refused, string(client.CodeTokenExpired)
		}, ""},
		{"the writer lost its participant", func(ops *[]Op, _ *[]Delivery, _ *convLog) { (*ops)[3].Outcome = Lost }, InvKeepsBinding},
		{"a gap in the records", func(_ *[]Op, _ *[]Delivery, l *convLog) { l.records[2].Seq = 4 }, InvNoFork},
		{"a repeated record seq", func(_ *[]Op, _ *[]Delivery, l *convLog) { l.records[2].Seq = 2 }, InvNoFork},
		{"a live binding bound again", func(_ *[]Op, _ *[]Delivery, l *convLog) { l.records[1].Participant = 2 }, InvBindingsEnd},
		{"a binding ended twice", func(_ *[]Op, _ *[]Delivery, l *convLog) {
			l.records = append(l.records, outbox.Record{Seq: 4, Kind: outbox.KindDetached, Participant: 1},
				outbox.Record{Seq: 5, Kind: outbox.KindDied, Participant: 1})
		}, InvBindingsEnd},
		{"a delivery out of order", func(_ *[]Op, dels *[]Delivery, _ *convLog) { *dels = append(*dels, (*dels)[0]) }, InvReaderOrdered},
		{"a delivery the log does not hold", func(_ *[]Op, dels *[]Delivery, _ *convLog) { (*dels)[1].Payload = "w/2" }, InvReaderMatches},
		{"a record never delivered", func(_ *[]Op, dels *[]Delivery, _ *convLog) { *dels = (*dels)[:1] }, InvReaderComplete},
		{"an oversized tell refused too_large", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			*ops = append(*ops, Op{Client: "writer-1", Kind: "oversized", Conversation: 1, Participant: 1, Token: "cc",
				Outcome: Refused, Code: string(client.CodeTooLarge)})
		}, ""},
		{"an oversized tell in doubt", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			*ops = append(*ops, Op{Client: "writer-1", Kind: "oversized", Conversation: 1, Participant: 1, Token: "cc",
				Outcome: Unknown, Code: string(client.CodeInDoubt)})
		}, InvTooLargeFinal},
		{"a call past its context", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			(*ops)[2].End = (*ops)[2].Start + (callTimeout + 2*stuckGrace).Milliseconds()
		}, InvNotStuck},
		{"a detach answered, its record in the log", func(ops *[]Op, _ *[]Delivery, l *convLog) {
			*ops = append(*ops, Op{Client: "writer-1", Kind: "detach", Conversation: 1, Participant: 1, Token: "dd", Outcome: Answered, Seq: 4})
			l.records = append(l.records, outbox.Record{Seq: 4, Kind: outbox.KindDetached, Participant: 1})
		}, ""},
		{"a detach answered, then its participant attached again", func(ops *[]Op, _ *[]Delivery, l *convLog) {
			*ops = append(*ops, Op{Client: "writer-1", Kind: "detach", Conversation: 1, Participant: 1, Token: "dd", Outcome: Answered, Seq: 4})
			l.records = append(l.records, outbox.Record{Seq: 4, Kind: outbox.KindDetached, Participant: 1},
				outbox.Record{Seq: 5, Kind: outbox.KindAttached, Participant: 1})
		}, InvDetachHolds},
		{"a detach answered at a seq that is not its record", func(ops *[]Op, _ *[]Delivery, _ *convLog) {
			*ops = append(*ops, Op{Client: "writer-1", Kind: "detach", Conversation: 1, Participant: 1, Token: "dd", Outcome: Answered, Seq: 3})
		}, InvDetachHolds},
	} {
		ops, dels, logs := consistentRun()
		tc.change(&ops, &dels, logs[1])
		vs := checkHistory(ops, dels, logs)
		got := make([]string, len(vs))
		for i, v := range vs {
			got[i] = v.Invariant
		}
		switch {
		case tc.want == "" && len(vs) > 0:
			t.Errorf("%s: %v, want no violation", tc.what, vs)
		case tc.want != "" && !slices.Contains(got, tc.want):
			t.Errorf("%s: %v, want %s", tc.what, vs, tc.want)
		}
	}
}

// TestCheckRace_EachRuleCanFail: the restore race's judge passes a
// restore that wrote alone, and names each way a node can break into it.
func TestCheckRace_EachRuleCanFail(t *testing.T) {
	rev := int64(10)
	put := func(key string) *clientv3.Event {
		rev++
		return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(restorePrefix + key), CreateRevision: rev, ModRevision: rev}}
	}
	del := func(key string) *clientv3.Event {
		rev++
		return &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(restorePrefix + key), ModRevision: rev}}
	}
	marker := cluster.RestoringKey
	for _, tc := range []struct {
		name  string
		evs   func() []*clientv3.Event
		fails bool
	}{
		{"restore, then a node", func() []*clientv3.Event {
			return []*clientv3.Event{put(marker), put("conv/1"), del(marker), put("node/r1"), put("own/1")}
		}, false},
		{"a node, gone before the restore", func() []*clientv3.Event {
			return []*clientv3.Event{put("node/r1"), del("node/r1"), put(marker), del(marker)}
		}, false},
		{"the restore over a live node", func() []*clientv3.Event {
			return []*clientv3.Event{put("node/r1"), put(marker), del(marker)}
		}, true},
		{"a node registers during the restore", func() []*clientv3.Event {
			return []*clientv3.Event{put(marker), put("node/r1"), del(marker)}
		}, true},
		{"a claim during the restore", func() []*clientv3.Event {
			return []*clientv3.Event{put(marker), put("own/1"), del(marker)}
		}, true},
	} {
		vs := checkRace(tc.evs())
		if (len(vs) > 0) != tc.fails {
			t.Errorf("%s: %v, want a violation: %v", tc.name, vs, tc.fails)
		}
	}
}
