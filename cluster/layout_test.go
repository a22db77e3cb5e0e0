package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// format1Tell is a tell recorded with testdata/format1.txt, and its seq.
type format1Tell struct {
	tell participant.Tell
	seq  participant.Seq
}

// loadFormat1 writes testdata/format1.txt (a prefix of format 1, one key
// per stream entry, written by a node before runs) under pfx and returns
// its tells.
func loadFormat1(t *testing.T, pfx string) []format1Tell {
	t.Helper()
	return loadGolden(t, pfx, "testdata/format1.txt", 6)
}

// loadGolden writes the golden prefix in file (format<N>.txt) under pfx
// and returns its tells, of which it must hold want.
func loadGolden(t *testing.T, pfx, file string, want int) []format1Tell {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kvs := make(map[string]string)
	var tells []format1Tell
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# tell "); ok {
			var conv, part, gen, i, seq uint64
			if _, err := fmt.Sscan(rest, &conv, &part, &gen, &i, &seq); err != nil {
				t.Fatalf("%s: %q: %v", file, line, err)
			}
			tells = append(tells, format1Tell{participant.Tell{Conversation: participant.ConversationID(conv),
				Participant: participant.ParticipantID(part), Generation: participant.Generation(gen),
				Token: tok(byte(10+conv), int(i)), Payload: fmt.Appendf(nil, "transfer %d00 to alice", i+1)}, participant.Seq(seq)})
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		q, err := strconv.QuotedPrefix(line)
		if err != nil {
			t.Fatalf("%s: %q: %v", file, line, err)
		}
		k, _ := strconv.Unquote(q)
		v, err := strconv.Unquote(strings.TrimSpace(line[len(q):]))
		if err != nil {
			t.Fatalf("%s: %q: %v", file, line, err)
		}
		kvs[k] = v
	}
	if len(tells) != want || len(kvs) < 20 {
		t.Fatalf("%s: %d tells, %d keys", file, len(tells), len(kvs))
	}
	writeAll(t, pfx, kvs)
	return tells
}

// formatOf returns the body of pfx's format key.
func formatOf(t *testing.T, pfx string) string {
	t.Helper()
	v, ok := dumpPrefix(t, pfx)[cluster.FormatKey]
	if !ok {
		t.Fatal("no format key")
	}
	body, err := cluster.UnsealRel(cluster.FormatKey, []byte(v))
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestFormat_AFormat1ClusterIsReadAndUpgradedAtStart: a prefix written
// before runs (format 1) is accepted by the offline tools' check, inspected
// and verified live and from a backup, and restored from that backup
// (served there after the start moves it); a node
// of this version refuses to move it to format 2 while another node is
// registered (an older node would fork a stream written as runs), writing
// nothing; with no node running it moves it at its start and serves it:
// every answered tell replays its seq, new tells continue each stream
// after its layout 1 entries, as runs, and a second node reads both.
func TestFormat_AFormat1ClusterIsReadAndUpgradedAtStart(t *testing.T) {
	pfx := prefix()
	tells := loadFormat1(t, pfx)
	ctx := context.Background()
	if err := cluster.CheckFormat(ctx, shared.Client.KV, pfx); err != nil {
		t.Fatalf("CheckFormat on format 1 = %v, want nil (the store reads it)", err)
	}
	// inspect and verify read it, live and from a backup, writing nothing.
	verifyClean(t, ctx, pfx, 2)
	var buf bytes.Buffer
	if _, err := backup.Export(ctx, shared.Client.KV, pfx, &buf, backup.Options{}); err != nil {
		t.Fatal(err)
	}
	snap, err := backup.Load(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	view := cluster.OpenView(snap, pfx)
	if err := view.CheckSums(ctx); err != nil {
		t.Fatalf("CheckSums of a format 1 backup = %v", err)
	}
	reports, err := participant.Inspect(view)
	view.Close()
	if err != nil || len(reports) != 2 || reports[0].Refused != nil || reports[1].Refused != nil || reports[0].OplogRows == 0 {
		t.Fatalf("Inspect of a format 1 backup = %+v, %v; want 2 conversations with rows, none refused", reports, err)
	}
	// Restored into an empty prefix, it is format 1 again, and served.
	restored := prefix()
	if _, err := backup.Restore(ctx, shared.Client.KV, restored, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{}); err != nil {
		t.Fatalf("Restore of a format 1 backup: %v", err)
	}
	if f := formatOf(t, restored); f != strconv.Itoa(cluster.FormatPerEntry) {
		t.Fatalf("restored format = %q, want %d", f, cluster.FormatPerEntry)
	}
	verifyClean(t, ctx, restored, 2)
	r := startMemberOn(t, newClient(t), restored, "r", 5*time.Second, participant.Options{})
	rc := r.svc.Connect(func() {})
	replayAll(t, rc, tells, "restored")
	r.svc.Close()
	r.node.Close()

	lease, err := shared.Client.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Client.Put(ctx, pfx+"node/old", `{"node":"old","addr":"old:7000"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	before := dumpPrefix(t, pfx)
	if n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "x", Prefix: pfx}); !errors.Is(err, cluster.ErrLiveNodes) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("Start on format 1 with a live node = %v, want ErrLiveNodes", err)
	}
	if got := dumpPrefix(t, pfx); len(got) != len(before) || got[cluster.FormatKey] != before[cluster.FormatKey] {
		t.Fatalf("the refused start wrote: %d keys before, %d after; format %q", len(before), len(got), formatOf(t, pfx))
	}
	if _, err := shared.Client.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}

	m := startMemberOn(t, newClient(t), pfx, "a", 5*time.Second, participant.Options{})
	if f := formatOf(t, pfx); f != strconv.Itoa(cluster.FormatVersion) {
		t.Fatalf("format after the start = %q, want %d", f, cluster.FormatVersion)
	}
	c := m.svc.Connect(func() {})
	replayAll(t, c, tells, "after the move")
	// A new participant of each conversation tells: the streams continue
	// after their layout 1 entries, as runs.
	var fresh []format1Tell
	for _, tl := range []format1Tell{tells[0], tells[3]} {
		conv := tl.tell.Conversation
		b, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(byte(200+conv), 0)})
		if err != nil {
			t.Fatalf("Enroll(%v): %v", conv, err)
		}
		for i := range 2 {
			req := participant.Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation,
				Token: tok(byte(210+conv), i), Payload: fmt.Appendf(nil, "again %d", i)}
			got, err := c.Tell(ctx, req)
			if err != nil || got.Replay != participant.ReplayNone || got.Seq <= tells[2].seq {
				t.Fatalf("new tell = %+v, %v; want a new seq after %d", got, err, tells[2].seq)
			}
			fresh = append(fresh, format1Tell{req, got.Seq})
		}
	}
	m.svc.Close()
	m.node.Close()
	verifyClean(t, ctx, pfx, 2) // layout 1 entries, then runs

	m2 := startMemberOn(t, newClient(t), pfx, "b", 5*time.Second, participant.Options{})
	c2 := m2.svc.Connect(func() {})
	replayAll(t, c2, append(tells, fresh...), "second node")
}

// TestFormat_AStartCutAtEveryCallIsStartedAgain kills a node's start on a
// format 1 prefix at every etcd call it makes, before the call or after it
// (its answer lost, as a crash right after the call loses it), around the
// one transaction that moves the format key to 2 in particular: the
// prefix is left in format 1 or in format 2, never anything else, its data
// as it was, and the next start, uncut, moves it if it was not moved and
// serves every answered tell.
func TestFormat_AStartCutAtEveryCallIsStartedAgain(t *testing.T) {
	ctx := context.Background()
	data := func(all map[string]string) map[string]string {
		out := make(map[string]string)
		for k, v := range all {
			if strings.HasPrefix(k, "d/") {
				out[k] = v
			}
		}
		return out
	}
	runs, moved, unmoved := 0, 0, 0
	for _, after := range []bool{false, true} {
		for cut := 0; ; cut++ {
			pfx := prefix()
			tells := loadFormat1(t, pfx)
			before := data(dumpPrefix(t, pfx))
			cli := newClient(t)
			var calls *etcdtest.Trigger
			cli.KV, calls = cutKV(cli.KV, cut, after)
			n, err := cluster.Start(ctx, cli, cluster.Options{NodeID: "cut", Advertise: "cut:7000", Prefix: pfx, LeaseTTL: 2 * time.Second})
			if n != nil {
				n.Close()
			}
			if calls.Seen() <= cut {
				if err != nil {
					t.Fatalf("uncut Start: %v", err)
				}
				break
			}
			runs++
			if err != nil && !errors.Is(err, errCut) {
				t.Fatalf("cut %d (after %v): Start = %v, want the cut's error or none", cut, after, err)
			}
			switch f := formatOf(t, pfx); f {
			case strconv.Itoa(cluster.FormatPerEntry):
				unmoved++
			case strconv.Itoa(cluster.FormatVersion):
				moved++
			default:
				t.Fatalf("cut %d (after %v): format %q, want %d or %d", cut, after, f, cluster.FormatPerEntry, cluster.FormatVersion)
			}
			if diff := cmp.Diff(before, data(dumpPrefix(t, pfx))); diff != "" {
				t.Fatalf("cut %d (after %v): the cut start changed the data (-before +after):\n%s", cut, after, diff)
			}
			m := startMemberOn(t, newClient(t), pfx, "a", 5*time.Second, participant.Options{})
			if f := formatOf(t, pfx); f != strconv.Itoa(cluster.FormatVersion) {
				t.Fatalf("cut %d (after %v): format after the next start = %q, want %d", cut, after, f, cluster.FormatVersion)
			}
			c := m.svc.Connect(func() {})
			replayAll(t, c, tells, fmt.Sprintf("cut %d (after %v)", cut, after))
			m.svc.Close()
			m.node.Close()
		}
	}
	// Cut before the move, the prefix stays format 1; cut after it, 2.
	if moved == 0 || unmoved == 0 {
		t.Fatalf("%d cut starts left format 2, %d format 1: the cuts missed the move", moved, unmoved)
	}
	t.Logf("%d cut starts: %d left format 1, %d format 2", runs, unmoved, moved)
}

// TestFormat_AFormat2ClusterIsServed: a prefix written by a node of this
// format (runs; testdata/format2.txt, written at 7a5b22a, a checkpoint
// after each conversation's third tell and token index entries with the
// rows) is accepted by the offline tools' check and verified clean, and a
// node started on it serves it as it is: every answered tell replays its
// seq, and new tells continue each stream. The golden pins the format: a
// later one must still read what this one wrote.
func TestFormat_AFormat2ClusterIsServed(t *testing.T) {
	pfx := prefix()
	tells := loadGolden(t, pfx, "testdata/format2.txt", 12)
	ctx := context.Background()
	if err := cluster.CheckFormat(ctx, shared.Client.KV, pfx); err != nil {
		t.Fatalf("CheckFormat on format 2 = %v", err)
	}
	verifyClean(t, ctx, pfx, 2)
	m := startMemberOn(t, newClient(t), pfx, "b", 5*time.Second, participant.Options{})
	if f := formatOf(t, pfx); f != strconv.Itoa(cluster.FormatVersion) {
		t.Fatalf("format after the start = %q, want %d", f, cluster.FormatVersion)
	}
	c := m.svc.Connect(func() {})
	replayAll(t, c, tells, "format 2")
	// A new participant of each conversation tells: its join and its tell
	// continue the streams after the golden's last seq (and the end of the
	// golden node's binding, which the load records).
	for _, conv := range []participant.ConversationID{1, 2} {
		last := tells[len(tells)-1].seq
		b, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(byte(200+conv), 0)})
		if err != nil {
			t.Fatalf("Enroll(%v): %v", conv, err)
		}
		req := participant.Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Token: tok(byte(210+conv), 0), Payload: []byte("after the golden")}
		got, err := c.Tell(ctx, req)
		if err != nil || got.Replay != participant.ReplayNone || got.Seq <= last+1 {
			t.Fatalf("new tell in %v = %+v, %v; want a new seq after %d and the join", conv, got, err, last)
		}
	}
	m.svc.Close()
	m.node.Close()
	verifyClean(t, ctx, pfx, 2)
}

// replayAll sends every tell of tells again on c and fails the test,
// naming what (the node or the cut), unless each replays its seq.
func replayAll(t *testing.T, c *participant.Conn, tells []format1Tell, what string) {
	t.Helper()
	for _, tl := range tells {
		got, err := c.Tell(context.Background(), tl.tell)
		if err != nil || got.Seq != tl.seq || got.Replay == participant.ReplayNone {
			t.Fatalf("%s: replay of %s in %v = %+v, %v; want seq %d replayed", what, tl.tell.Payload, tl.tell.Conversation, got, err, tl.seq)
		}
	}
}
