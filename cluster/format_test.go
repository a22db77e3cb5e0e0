package cluster_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

// formatData serves a small data set under pfx with one node (two
// conversations, tells told), stops it, and returns a replay of every
// tell: each must answer its committed seq again.
func formatData(t *testing.T, pfx string) (replay func(m *member) error) {
	t.Helper()
	ctx := context.Background()
	type told struct {
		tell participant.Tell
		seq  participant.Seq
	}
	var tells []told
	func() {
		m := startMemberOn(t, newClient(t), pfx, "a", 5*time.Second, participant.Options{})
		defer func() {
			m.svc.Close()
			m.node.Close()
		}()
		c := m.svc.Connect(func() {})
		for conv := participant.ConversationID(1); conv <= 2; conv++ {
			b, err := c.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(byte(conv), 0)})
			if err != nil {
				t.Fatalf("Enroll(%v): %v", conv, err)
			}
			for i := range 3 {
				req := participant.Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation,
					Token: tok(byte(10+conv), i), Payload: fmt.Appendf(nil, "transfer %d00 to alice", i+1)}
				got, err := c.Tell(ctx, req)
				if err != nil {
					t.Fatalf("Tell: %v", err)
				}
				tells = append(tells, told{req, got.Seq})
			}
		}
	}()
	return func(m *member) error {
		c := m.svc.Connect(func() {})
		for _, tl := range tells {
			got, err := c.Tell(ctx, tl.tell)
			if err != nil {
				return fmt.Errorf("replay of %s: %w", tl.tell.Payload, err)
			}
			if got.Seq != tl.seq || got.Replay == participant.ReplayNone {
				return fmt.Errorf("replay of %s = %+v, want seq %d replayed", tl.tell.Payload, got, tl.seq)
			}
		}
		return nil
	}
}

// dumpPrefix returns every key under pfx (relative to it) and its value.
func dumpPrefix(t *testing.T, pfx string) map[string]string {
	t.Helper()
	resp, err := shared.Client.Get(context.Background(), pfx, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key[len(pfx):])] = string(kv.Value)
	}
	return out
}

// unsealAll returns the bodies of sealed, a dump of a checksummed prefix,
// without its format key: the layout every version before checksums wrote
// (the seal only appends a trailer to the same bytes; a run of entries
// was one key per entry then, each its bare payload).
func unsealAll(t *testing.T, sealed map[string]string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(sealed))
	for rel, v := range sealed {
		if rel == cluster.FormatKey {
			continue
		}
		if cluster.Ephemeral(rel) {
			t.Fatalf("%s is still held: the node did not stop", rel)
		}
		if d, ok := strings.CutPrefix(rel, cluster.DataPrefix); ok && isEntryKey(d) {
			ents, _, err := etcdstore.RunEntries(cluster.DataPrefix, d, []byte(v))
			if err != nil {
				t.Fatal(err)
			}
			first := binary.BigEndian.Uint64([]byte(rel[len(rel)-8:]))
			for i, e := range ents {
				out[rel[:len(rel)-8]+string(binary.BigEndian.AppendUint64(nil, first+uint64(i)))] = string(e)
			}
			continue
		}
		body, err := cluster.UnsealRel(rel, []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		out[rel] = string(body)
	}
	return out
}

// isEntryKey reports whether d, a key relative to the data prefix, is a
// stream's entry (run) key: g/s/… or c/<scope>/s/….
func isEntryKey(d string) bool {
	if rest, ok := strings.CutPrefix(d, "c/"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return strings.HasPrefix(rest[i+1:], "s/")
		}
		return false
	}
	return strings.HasPrefix(d, "g/s/")
}

// writeAll writes kvs under pfx, in transactions of 64.
func writeAll(t *testing.T, pfx string, kvs map[string]string) {
	t.Helper()
	var ops []clientv3.Op
	flush := func() {
		if _, err := shared.Client.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for k, v := range kvs {
		ops = append(ops, clientv3.OpPut(pfx+k, v))
		if len(ops) == 64 {
			flush()
		}
	}
	flush()
}

// legacyCluster returns a prefix holding a data set as a version before
// checksums left it (every value bare, no format key), and the replay
// of its tells.
func legacyCluster(t *testing.T) (string, map[string]string, func(*member) error) {
	t.Helper()
	src := prefix()
	replay := formatData(t, src)
	bare := unsealAll(t, dumpPrefix(t, src))
	pfx := prefix()
	writeAll(t, pfx, bare)
	return pfx, bare, replay
}

// TestFormat_AnUnconvertedClusterIsRefusedUntilConverted: a node of this
// version meeting a data set written before checksums (no format key)
// refuses to start, naming the conversion command, and writes nothing;
// so do the offline tools. After participantctl convert-etcd's Convert
// every value is sealed, the format key is written, a node starts and
// replays every answered tell, and verify finds every checksum good. A
// second Convert does nothing; a newer format is refused.
func TestFormat_AnUnconvertedClusterIsRefusedUntilConverted(t *testing.T) {
	pfx, bare, replay := legacyCluster(t)
	ctx := context.Background()
	_, err := cluster.Start(ctx, newClient(t), cluster.Options{NodeID: "b", Prefix: pfx})
	if !errors.Is(err, cluster.ErrUnconverted) || !strings.Contains(err.Error(), "participantctl convert-etcd") {
		t.Fatalf("Start on a cluster before checksums = %v, want ErrUnconverted naming participantctl convert-etcd", err)
	}
	if diff := cmp.Diff(bare, dumpPrefix(t, pfx)); diff != "" {
		t.Fatalf("the refused start wrote under the prefix (-before +after):\n%s", diff)
	}
	if err := cluster.CheckFormat(ctx, shared.Client.KV, pfx); !errors.Is(err, cluster.ErrUnconverted) {
		t.Fatalf("CheckFormat = %v, want ErrUnconverted", err)
	}

	sum, err := cluster.Convert(ctx, shared.Client.KV, pfx, cluster.ConvertOptions{MaxTxnOps: 8})
	if err != nil {
		t.Fatalf("Convert: %v", err)
	}
	if sum.Already || sum.Sealed != int64(len(bare)) || sum.Verified != 0 {
		t.Fatalf("Convert = %+v, want %d values sealed", sum, len(bare))
	}
	checkConverted(t, pfx, bare)
	m := startMemberOn(t, newClient(t), pfx, "b", 5*time.Second, participant.Options{})
	if err := replay(m); err != nil {
		t.Fatal(err)
	}
	verifyClean(t, ctx, pfx, 2)
	m.svc.Close()
	m.node.Close()

	if sum, err := cluster.Convert(ctx, shared.Client.KV, pfx, cluster.ConvertOptions{}); err != nil || !sum.Already {
		t.Fatalf("Convert of a converted prefix = %+v, %v; want Already", sum, err)
	}
	put := func(k, v string) {
		t.Helper()
		if _, err := shared.Client.Put(ctx, pfx+k, v); err != nil {
			t.Fatal(err)
		}
	}
	newer := strconv.Itoa(cluster.FormatVersion + 1)
	put(cluster.FormatKey, cluster.SealRel(cluster.FormatKey, []byte(newer)))
	if _, err := cluster.Start(ctx, newClient(t), cluster.Options{NodeID: "c", Prefix: pfx}); !errors.Is(err, cluster.ErrNewerFormat) {
		t.Fatalf("Start on format %s = %v, want ErrNewerFormat", newer, err)
	}
	if _, err := cluster.Convert(ctx, shared.Client.KV, pfx, cluster.ConvertOptions{}); !errors.Is(err, cluster.ErrNewerFormat) {
		t.Fatalf("Convert of format %s = %v, want ErrNewerFormat", newer, err)
	}
}

// checkConverted checks that pfx holds exactly the keys of bare, each
// sealed under its key, and the format key, and no conversion marker.
func checkConverted(t *testing.T, pfx string, bare map[string]string) {
	t.Helper()
	got := dumpPrefix(t, pfx)
	if err := cluster.ParseFormat([]byte(got[cluster.FormatKey])); err != nil {
		t.Fatalf("format key after the conversion: %v", err)
	}
	delete(got, cluster.FormatKey)
	bodies := make(map[string]string, len(got))
	for rel, v := range got {
		body, err := cluster.UnsealRel(rel, []byte(v))
		if err != nil {
			t.Fatalf("after the conversion: %v", err)
		}
		bodies[rel] = string(body)
	}
	if diff := cmp.Diff(bare, bodies); diff != "" {
		t.Fatalf("converted prefix (-before +after, bodies):\n%s", diff)
	}
}

var errCut = errors.New("cut")

// cutKV returns kv with its cut-th call (Gets and transaction commits,
// counted from 0) failed with errCut: before sending it, or, with after,
// once etcd answered it (the outcome lost, as a crash right after the call
// would lose it). The trigger's Seen counts the calls.
func cutKV(kv clientv3.KV, cut int, after bool) (clientv3.KV, *etcdtest.Trigger) {
	calls := new(etcdtest.Trigger)
	calls.Arm(cut + 1)
	return etcdtest.Hook(kv, etcdtest.Hooks{
		Txn: func(_ context.Context, t *etcdtest.Txn) (*clientv3.TxnResponse, error) {
			return cutCall(calls, after, t.Send)
		},
		Get: func(_ context.Context, g *etcdtest.Get) (*clientv3.GetResponse, error) {
			return cutCall(calls, after, g.Send)
		},
	}), calls
}

// cutCall sends a call unless calls fires on it; then it fails with
// errCut, having sent it if after.
func cutCall[R any](calls *etcdtest.Trigger, after bool, send func() (R, error)) (R, error) {
	if !calls.Hit() {
		return send()
	}
	if after {
		send()
	}
	var none R
	return none, errCut
}

// TestConvert_CutAtEveryStep cuts a conversion at every etcd call it
// makes, before the call and after it (its answer lost), in transactions
// of a few keys: after each cut a node of this version still refuses the
// prefix (unless the cut fell after the last transaction), and a second,
// uncut Convert finishes it: every value sealed once, under its key, the
// format key written, no marker left, and a node serves every answered
// tell.
func TestConvert_CutAtEveryStep(t *testing.T) {
	_, bare, replay := legacyCluster(t)
	ctx := context.Background()
	opts := cluster.ConvertOptions{MaxTxnOps: 6}
	runs := 0
	for _, after := range []bool{false, true} {
		for cut := 0; ; cut++ {
			pfx := prefix()
			writeAll(t, pfx, bare)
			kv, calls := cutKV(shared.Client.KV, cut, after)
			_, err := cluster.Convert(ctx, kv, pfx, opts)
			if calls.Seen() <= cut {
				if err != nil {
					t.Fatalf("uncut Convert: %v", err)
				}
				break
			}
			runs++
			if !errors.Is(err, errCut) {
				t.Fatalf("cut %d (after %v): Convert = %v, want the cut's error", cut, after, err)
			}
			if _, ok := dumpPrefix(t, pfx)[cluster.FormatKey]; !ok {
				_, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "x", Prefix: pfx})
				if !errors.Is(err, cluster.ErrUnconverted) {
					t.Fatalf("cut %d (after %v): Start on a cut conversion = %v, want ErrUnconverted", cut, after, err)
				}
			}
			if _, err := cluster.Convert(ctx, shared.Client.KV, pfx, opts); err != nil {
				t.Fatalf("cut %d (after %v): Convert again: %v", cut, after, err)
			}
			checkConverted(t, pfx, bare)
		}
	}
	if runs < 10 {
		t.Fatalf("the loop cut %d runs; the conversion should make more calls", runs)
	}
	t.Logf("cut %d runs", runs)
	// A conversion cut and finished is served.
	pfx := prefix()
	writeAll(t, pfx, bare)
	kv, _ := cutKV(shared.Client.KV, 3, false)
	if _, err := cluster.Convert(ctx, kv, pfx, opts); !errors.Is(err, errCut) {
		t.Fatal(err)
	}
	if _, err := cluster.Convert(ctx, shared.Client.KV, pfx, opts); err != nil {
		t.Fatal(err)
	}
	m := startMemberOn(t, newClient(t), pfx, "b", 5*time.Second, participant.Options{})
	if err := replay(m); err != nil {
		t.Fatal(err)
	}
}

// TestConvert_RefusesLiveNodes: the conversion is offline: a node
// registered under the prefix (its lease live) makes it refuse, with
// nothing written.
func TestConvert_RefusesLiveNodes(t *testing.T) {
	pfx, bare, _ := legacyCluster(t)
	ctx := context.Background()
	lease, err := shared.Client.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Client.Revoke(ctx, lease.ID)
	if _, err := shared.Client.Put(ctx, pfx+"node/old", `{"node":"old","addr":"old:7000"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Convert(ctx, shared.Client.KV, pfx, cluster.ConvertOptions{}); !errors.Is(err, cluster.ErrLiveNodes) {
		t.Fatalf("Convert with a live node = %v, want ErrLiveNodes", err)
	}
	got := dumpPrefix(t, pfx)
	delete(got, "node/old")
	if diff := cmp.Diff(bare, got); diff != "" {
		t.Fatalf("the refused conversion wrote (-before +after):\n%s", diff)
	}
}

// TestSums_DamageIsContained flips one bit in values of the running data
// set, one kind at a time, and checks the containment: a conversation's
// value (an oplog row, a token index entry) makes that conversation
// unloadable store_corrupt for verify while the other verifies, and a
// node serving the damaged conversation refuses it while it serves the
// other; global damage (the format key, the ordinal counter, the node
// key, a node's incarnation) makes the start fail. The checksum sweep of
// verify (View.CheckSums) finds each.
func TestSums_DamageIsContained(t *testing.T) {
	src := prefix()
	formatData(t, src)
	sealed := dumpPrefix(t, src)
	ctx := context.Background()
	fresh := func() string {
		pfx := prefix()
		writeAll(t, pfx, sealed)
		return pfx
	}
	flip := func(pfx, rel string) {
		t.Helper()
		v := []byte(sealed[rel])
		if len(v) == 0 {
			t.Fatalf("no value %s in %v", rel, keysOf(sealed))
		}
		v[len(v)/2] ^= 0x10
		if _, err := shared.Client.Put(ctx, pfx+rel, string(v)); err != nil {
			t.Fatal(err)
		}
	}
	find := func(sub string) string {
		for rel := range sealed {
			if strings.Contains(rel, sub) {
				return rel
			}
		}
		t.Fatalf("no key holds %q: %v", sub, keysOf(sealed))
		return ""
	}
	for _, rel := range []string{find("d/c/1/s/\x00\x07oplog/1"), find("d/c/1/v/token/1/e/")} {
		pfx := fresh()
		flip(pfx, rel)
		v := cluster.OpenView(etcdstore.AtRevision(shared.Client.KV, currentRev(t)), pfx)
		if err := v.CheckSums(ctx); !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%q flipped: CheckSums = %v, want store.ErrCorrupt", rel, err)
		}
		reports, err := participant.Inspect(v)
		v.Close()
		if err != nil {
			t.Fatalf("%q flipped: Inspect: %v", rel, err)
		}
		for _, r := range reports {
			switch {
			case r.Conversation == 1 && (r.Refused == nil || r.Refused.Class != participant.ClassStoreCorrupt):
				t.Errorf("%q flipped: conversation 1 = %+v, want refused store_corrupt", rel, r.Refused)
			case r.Conversation == 2 && r.Refused != nil:
				t.Errorf("%q flipped: conversation 2 refused %+v", rel, r.Refused)
			}
		}
		m := startMemberOn(t, newClient(t), pfx, "b", 5*time.Second, participant.Options{})
		c := m.svc.Connect(func() {})
		if _, err := c.Enroll(ctx, participant.Enroll{Conversation: 2, Token: tok(99, 0)}); err != nil {
			t.Errorf("%q flipped: Enroll into conversation 2 = %v, want served", rel, err)
		}
		if _, err := c.Enroll(ctx, participant.Enroll{Conversation: 1, Token: tok(1, 0)}); err == nil {
			t.Errorf("%q flipped: the replay of conversation 1's enroll was answered", rel)
		}
		m.svc.Close()
		m.node.Close()
	}
	for _, rel := range []string{cluster.FormatKey, "ordinals", "ordinal/a", cluster.NodeKeyName, find("/incarnation")} {
		pfx := fresh()
		flip(pfx, rel)
		id := "a"
		if rel == "ordinals" {
			id = "z" // a node that joins for the first time reads the counter
		}
		n, err := cluster.Start(ctx, newClient(t), cluster.Options{NodeID: id, Prefix: pfx})
		if err == nil {
			if _, err = n.NodeKey(ctx); err == nil {
				_, err = participant.Open(ctx, n.Store(), participant.Options{NodeKey: make([]byte, participant.NodeKeySize), Ownership: n})
			}
			n.Close()
		}
		if !errors.Is(err, store.ErrCorrupt) {
			t.Errorf("%q flipped: the start = %v, want refused store.ErrCorrupt", rel, err)
		}
	}
}

func currentRev(t *testing.T) int64 {
	t.Helper()
	resp, err := shared.Client.Get(context.Background(), "any", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprintf("%q", k))
	}
	return out
}
