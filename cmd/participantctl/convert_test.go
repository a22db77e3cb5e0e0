package main

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

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

// TestConvertEtcd_AClusterBeforeChecksums: a prefix as a release before
// etcd checksums left it (every value bare, no format key) is refused by
// verify with a message naming convert-etcd; convert-etcd seals it and
// verifies it; a node of this release then serves it (a retried tell
// replays its seq) and a second convert-etcd does nothing.
func TestConvertEtcd_AClusterBeforeChecksums(t *testing.T) {
	ctx := testCtx(t)
	etcd, err := etcdtest.Start(t.TempDir(), etcdtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	eps := strings.Join(etcd.Endpoints(), ",")
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	node := func(id string) *servertest.Server {
		return servertest.Start(t, server.Config{
			DataDir: t.TempDir(), CheckpointInterval: time.Hour,
			Cluster: server.ClusterConfig{Endpoints: etcd.Endpoints(), NodeID: id, Prefix: "/old/", LeaseTTL: time.Second},
		})
	}
	a := node("a")
	creds := t.TempDir() + "/c.json"
	mustCtl(t, ctx, "enroll", "--addr", a.Addr().String(), "--conversation", "7", "--creds", creds)
	tok := client.NewToken().String()
	seq := strings.TrimSpace(mustCtl(t, ctx, "tell", "--addr", a.Addr().String(), "--creds", creds, "--token", tok, "kept"))
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	// What the release before checksums wrote: the same bodies, bare.
	resp, err := cli.Get(ctx, "/old/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ops := []clientv3.Op{clientv3.OpDelete("/old/" + cluster.FormatKey)}
	for _, kv := range resp.Kvs {
		rel := strings.TrimPrefix(string(kv.Key), "/old/")
		if rel == cluster.FormatKey {
			continue
		}
		if cluster.Ephemeral(rel) {
			t.Fatalf("%s is still held after the node stopped", rel)
		}
		if d, ok := strings.CutPrefix(rel, cluster.DataPrefix); ok && isEntryKey(d) {
			// A run was one key per entry then, each its bare payload.
			ents, _, err := etcdstore.RunEntries(cluster.DataPrefix, d, kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			key := string(kv.Key)
			first := binary.BigEndian.Uint64([]byte(key[len(key)-8:]))
			for i, e := range ents {
				ops = append(ops, clientv3.OpPut(key[:len(key)-8]+string(binary.BigEndian.AppendUint64(nil, first+uint64(i))), string(e)))
			}
			continue
		}
		body, err := cluster.UnsealRel(rel, kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(string(kv.Key), string(body)))
	}
	if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}

	if out, errs, code := ctl(ctx, "", "verify", "--etcd-endpoints", eps, "--etcd-prefix", "/old/"); code == 0 || !strings.Contains(errs, "participantctl convert-etcd") {
		t.Fatalf("verify of an unconverted prefix = exit %d, %q %q; want a refusal naming convert-etcd", code, out, errs)
	}
	if got := mustCtl(t, ctx, "convert-etcd", "--etcd-endpoints", eps, "--etcd-prefix", "/old/"); !strings.Contains(got, "converted /old/ to format 2") || !strings.Contains(got, "conversation 7: ok") {
		t.Fatalf("convert-etcd = %q, want converted and verified", got)
	}
	if got := mustCtl(t, ctx, "convert-etcd", "--etcd-endpoints", eps, "--etcd-prefix", "/old/"); !strings.Contains(got, "already format 2") {
		t.Fatalf("convert-etcd again = %q, want nothing to convert", got)
	}
	first, _, _ := strings.Cut(mustCtl(t, ctx, "convert-etcd", "--json", "--etcd-endpoints", eps, "--etcd-prefix", "/old/"), "\n")
	if want := `{"result":"converted","prefix":"/old/","format":2,"already":true,"sealed":0,"found_sealed":0,"txns":0}`; first != want {
		t.Fatalf("convert-etcd --json's first line = %s, want %s", first, want)
	}
	b := node("b")
	again := strings.TrimSpace(mustCtl(t, ctx, "tell", "--addr", b.Addr().String(), "--creds", creds, "--token", tok, "kept"))
	if again != seq {
		t.Fatalf("the retried tell on the converted prefix = %q, want its seq %q", again, seq)
	}
}
