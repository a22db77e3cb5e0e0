package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/store/etcdstore/etcdtest"
)

var shared *etcdtest.Shared

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(m, "backup-test", &shared))
}

// dump returns every key under prefix at rev (0: now), relative to
// prefix, leaving out the ephemeral claims.
func dump(t *testing.T, prefix string, rev int64) map[string]string {
	t.Helper()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := shared.Client.Get(context.Background(), prefix, opts...)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string)
	for _, kv := range resp.Kvs {
		rel := string(kv.Key[len(prefix):])
		if !cluster.Ephemeral(rel) {
			out[rel] = string(kv.Value)
		}
	}
	return out
}

// entries reads every entry of the backup b.
func entries(t *testing.T, b []byte) (backup.Header, map[string]string) {
	t.Helper()
	r, err := backup.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string)
	for {
		e, err := r.Next()
		if err == io.EOF {
			return r.Header(), out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[string(e.Key)] = string(e.Value)
	}
}

func put(t *testing.T, key, val string) {
	t.Helper()
	if _, err := shared.Client.Put(context.Background(), key, val); err != nil {
		t.Fatal(err)
	}
}

// TestExport_OneRevisionUnderWrites: a backup taken in small pages while
// writers change and add keys holds exactly the prefix's keys at the
// header's revision, without the ephemeral claims, and restores into
// another prefix key for key.
func TestExport_OneRevisionUnderWrites(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	for i := range 200 {
		put(t, fmt.Sprintf("%sd/c/%d/v/x", p, i), fmt.Sprint(i))
	}
	put(t, p+"own/7", `{"node":"n1"}`)
	put(t, p+"node/n1", `{"node":"n1"}`)
	put(t, p+"secret/node-key", "0123456789abcdef0123456789abcdef")
	put(t, p+"ordinal/n1", "1")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := shared.Client.Put(ctx, fmt.Sprintf("%sd/c/%d/v/x", p, i%300), fmt.Sprint("w", i)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var buf bytes.Buffer
	h, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{PageBytes: 256})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	want := dump(t, p, h.Revision)
	if _, ok := want["own/7"]; ok {
		t.Fatal("dump kept an ephemeral key")
	}
	gotH, got := entries(t, buf.Bytes())
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("backup at revision %d differs from etcd at it (-etcd +backup):\n%s", h.Revision, diff)
	}
	if diff := cmp.Diff(h, gotH); diff != "" {
		t.Fatalf("header read back differs (-written +read):\n%s", diff)
	}
	if h.Keys != int64(len(want)) || h.Prefix != p {
		t.Fatalf("header = %+v, want %d keys of %s", h, len(want), p)
	}

	q := shared.Prefix()
	sum, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{MaxTxnOps: 16})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Keys != h.Keys || sum.Txns < int(h.Keys)/16 {
		t.Fatalf("restore = %+v, want %d keys in at least %d transactions", sum, h.Keys, h.Keys/16)
	}
	if diff := cmp.Diff(want, dump(t, q, 0)); diff != "" {
		t.Fatalf("restored prefix differs from the backup (-backup +restored):\n%s", diff)
	}
}

// TestRestore_RefusesNonEmptyPrefix: a prefix holding any key is refused
// and left as it was.
func TestRestore_RefusesNonEmptyPrefix(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	put(t, p+"d/g/v/a", "x")
	var buf bytes.Buffer
	if _, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{}); err != nil {
		t.Fatal(err)
	}
	q := shared.Prefix()
	put(t, q+"anything", "y")
	_, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{})
	if !errors.Is(err, backup.ErrNotEmpty) {
		t.Fatalf("Restore into a non-empty prefix = %v, want ErrNotEmpty", err)
	}
	if diff := cmp.Diff(map[string]string{"anything": "y"}, dump(t, q, 0)); diff != "" {
		t.Fatalf("refused restore changed the prefix:\n%s", diff)
	}
}

// TestRestore_RefusesDamagedFile: a flipped byte anywhere, a cut file and
// bytes after the trailer are refused before anything is written.
func TestRestore_RefusesDamagedFile(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	for i := range 20 {
		put(t, fmt.Sprintf("%sd/c/%d/s/entry", p, i), fmt.Sprintf("payload %d", i))
	}
	var buf bytes.Buffer
	if _, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{}); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	damaged := map[string][]byte{
		"cut":      good[:len(good)-1],
		"appended": append(bytes.Clone(good), 0),
		"empty":    nil,
	}
	for _, at := range []int{0, 3, len(backup.Magic) + 2, len(good) / 2, len(good) - 40, len(good) - 1} {
		b := bytes.Clone(good)
		b[at] ^= 0x20
		damaged[fmt.Sprintf("flip@%d", at)] = b
	}
	for name, b := range damaged {
		t.Run(name, func(t *testing.T) {
			q := shared.Prefix()
			_, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(b), backup.RestoreOptions{})
			if !errors.Is(err, backup.ErrCorrupt) && !errors.Is(err, backup.ErrNotBackup) && !errors.Is(err, backup.ErrVersion) {
				t.Fatalf("Restore = %v, want a refused file", err)
			}
			if n := len(dump(t, q, 0)); n != 0 {
				t.Fatalf("a refused file wrote %d keys", n)
			}
		})
	}
}

// TestExport_CompactedRevision: a revision etcd compacted away fails with
// ErrCompacted, not with a partial backup.
func TestExport_CompactedRevision(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	put(t, p+"d/g/v/a", "1")
	resp, err := shared.Client.Get(ctx, p+"d/g/v/a")
	if err != nil {
		t.Fatal(err)
	}
	old := resp.Header.Revision
	put(t, p+"d/g/v/a", "2")
	resp, err = shared.Client.Get(ctx, p+"d/g/v/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	_, err = backup.Export(ctx, shared.Client.KV, p, io.Discard, backup.Options{Revision: old})
	if !errors.Is(err, backup.ErrCompacted) {
		t.Fatalf("Export at a compacted revision = %v, want ErrCompacted", err)
	}
}

// TestSnapshot_ServesTheStoreReads: a backup loaded as a KV answers the
// range reads the etcd store makes as etcd does, and refuses writes.
func TestSnapshot_ServesTheStoreReads(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	for _, k := range []string{"a", "b/1", "b/2", "b/3", "c"} {
		put(t, p+k, "v"+k)
	}
	var buf bytes.Buffer
	h, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := backup.Load(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	live := etcdstore.AtRevision(shared.Client.KV, h.Revision)
	reads := []struct {
		key  string
		opts []clientv3.OpOption
	}{
		{p + "a", nil},
		{p + "zz", nil},
		{p + "b/", []clientv3.OpOption{clientv3.WithPrefix()}},
		{p + "b/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(2)}},
		{p + "b/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}},
		{p + "a", []clientv3.OpOption{clientv3.WithRange(p + "c"), clientv3.WithKeysOnly()}},
		{p + "b/2", []clientv3.OpOption{clientv3.WithRange(p + "c\x00"), clientv3.WithLimit(10)}},
		// The last key of a range (a stream's last run, the run holding a seq).
		{p + "b/", []clientv3.OpOption{clientv3.WithRange(p + "b/3"), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1)}},
		{p + "a", []clientv3.OpOption{clientv3.WithRange(p + "c\x00"), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly()}},
		{p + "zz", []clientv3.OpOption{clientv3.WithRange(p + "zzz"), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1)}},
	}
	type kv struct{ K, V string }
	type result struct {
		Count int64
		More  bool
		Kvs   []kv
	}
	norm := func(r *clientv3.GetResponse) result {
		out := result{Count: r.Count, More: r.More}
		for _, e := range r.Kvs {
			out.Kvs = append(out.Kvs, kv{string(e.Key), string(e.Value)})
		}
		return out
	}
	for _, rd := range reads {
		want, err := live.Get(ctx, rd.key, rd.opts...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := snap.Get(ctx, rd.key, rd.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(norm(want), norm(got)); diff != "" {
			t.Errorf("Get(%q) differs (-etcd +snapshot):\n%s", rd.key, diff)
		}
	}
	if _, err := snap.Put(ctx, p+"a", "x"); !errors.Is(err, etcdstore.ErrReadOnly) {
		t.Errorf("Put = %v, want ErrReadOnly", err)
	}
	if _, err := snap.Txn(ctx).Then(clientv3.OpPut(p+"a", "x")).Commit(); !errors.Is(err, etcdstore.ErrReadOnly) {
		t.Errorf("Txn = %v, want ErrReadOnly", err)
	}
	if _, err := live.Txn(ctx).Then(clientv3.OpPut(p+"a", "x")).Commit(); !errors.Is(err, etcdstore.ErrReadOnly) {
		t.Errorf("pinned Txn = %v, want ErrReadOnly", err)
	}
}

// TestRestore_MarkerKeepsNodesOut: a small backup restores in one
// transaction and leaves no marker; a prefix with the marker (a restore
// running or cut) is refused by cluster.Start.
func TestRestore_MarkerKeepsNodesOut(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	put(t, p+"d/g/v/a", "x")
	var buf bytes.Buffer
	if _, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{}); err != nil {
		t.Fatal(err)
	}
	q := shared.Prefix()
	sum, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{})
	if err != nil || sum.Txns != 1 {
		t.Fatalf("Restore = %+v, %v; want one transaction", sum, err)
	}
	if diff := cmp.Diff(map[string]string{"d/g/v/a": "x"}, dump(t, q, 0)); diff != "" {
		t.Fatalf("restored prefix (-want +got):\n%s", diff)
	}

	r := shared.Prefix()
	put(t, r+cluster.RestoringKey, "restoring")
	n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "n1", Prefix: r})
	if err == nil {
		n.Close()
	}
	if !errors.Is(err, cluster.ErrRestoring) {
		t.Fatalf("Start on a prefix being restored = %v, want ErrRestoring", err)
	}
}

// pageKV records the bytes of keys and values each Get returns.
type pageKV struct {
	clientv3.KV
	mu    sync.Mutex
	pages []int
}

func (p *pageKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := p.KV.Get(ctx, key, opts...)
	if err == nil && len(resp.Kvs) > 0 {
		n := 0
		for _, kv := range resp.Kvs {
			n += len(kv.Key) + len(kv.Value)
		}
		p.mu.Lock()
		p.pages = append(p.pages, n)
		p.mu.Unlock()
	}
	return resp, err
}

// TestExport_ReadsBoundedPages: Export never asks etcd for much more than
// PageBytes at once (about one average entry past it), whatever the size
// of the data set, so its memory does not grow with it.
func TestExport_ReadsBoundedPages(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	value := string(bytes.Repeat([]byte("v"), 4000))
	for i := range 300 {
		put(t, fmt.Sprintf("%sd/c/%d/b/checkpoint", p, i), value)
	}
	const pageBytes = 64 << 10
	kv := &pageKV{KV: shared.Client.KV}
	var out countingWriter
	h, err := backup.Export(ctx, kv, p, &out, backup.Options{PageBytes: pageBytes})
	if err != nil {
		t.Fatal(err)
	}
	if h.Keys != 300 || out.n < 300*4000 {
		t.Fatalf("exported %d keys in %d bytes, want 300 keys of 4000 bytes", h.Keys, out.n)
	}
	if len(kv.pages) < 300*4000/pageBytes {
		t.Fatalf("%d pages for %d bytes at %d per page", len(kv.pages), 300*4000, pageBytes)
	}
	for i, n := range kv.pages {
		if n > pageBytes+2*4100 {
			t.Errorf("page %d holds %d bytes, want about %d at most", i, n, pageBytes)
		}
	}
}

type countingWriter struct{ n int }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// TestView_CompactedRevisionIsAnError: a view pinned at a revision etcd
// compacted away fails its reads with rpctypes.ErrCompacted (which the
// offline tools explain), never answers from another revision.
func TestView_CompactedRevisionIsAnError(t *testing.T) {
	ctx := context.Background()
	p := shared.Prefix()
	put(t, p+"d/c/5/l/oplog/5", "\x00\x00\x00\x00\x00\x00\x00\x01")
	resp, err := shared.Client.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	old := resp.Header.Revision
	put(t, p+"d/g/v/x", "\x00\x00\x00\x00\x00\x00\x00\x01")
	resp, err = shared.Client.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	v := cluster.OpenView(etcdstore.AtRevision(shared.Client.KV, old), p)
	defer v.Close()
	if _, err := v.Len("oplog/5"); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("Len at a compacted revision = %v, want ErrCompacted", err)
	}
}

// TestRestore_KeepsThePrefixNodeKey: a prefix holding only its node key
// (the cluster's identity, kept across a wipe) refuses a backup that carries
// another key, with nothing written, unless ReplaceNodeKey; a backup with
// the same key restores around it.
func TestRestore_KeepsThePrefixNodeKey(t *testing.T) {
	ctx := context.Background()
	const ours, theirs = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	p := shared.Prefix()
	put(t, p+"d/g/v/a", "x")
	put(t, p+backup.NodeKeyKey, theirs)
	var buf bytes.Buffer
	if _, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{}); err != nil {
		t.Fatal(err)
	}
	want := dump(t, p, 0)

	q := shared.Prefix()
	put(t, q+backup.NodeKeyKey, ours)
	_, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{})
	if !errors.Is(err, backup.ErrNodeKeyDiffers) {
		t.Fatalf("Restore over another node key = %v, want ErrNodeKeyDiffers", err)
	}
	if diff := cmp.Diff(map[string]string{backup.NodeKeyKey: ours}, dump(t, q, 0)); diff != "" {
		t.Fatalf("refused restore changed the prefix:\n%s", diff)
	}
	if _, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{ReplaceNodeKey: true}); err != nil {
		t.Fatalf("Restore with ReplaceNodeKey = %v", err)
	}
	if diff := cmp.Diff(want, dump(t, q, 0)); diff != "" {
		t.Fatalf("restored prefix differs from the backup (-backup +restored):\n%s", diff)
	}

	r := shared.Prefix()
	put(t, r+backup.NodeKeyKey, theirs)
	sum, err := backup.Restore(ctx, shared.Client.KV, r, bytes.NewReader(buf.Bytes()), backup.RestoreOptions{})
	if err != nil {
		t.Fatalf("Restore over the same node key = %v", err)
	}
	if diff := cmp.Diff(want, dump(t, r, 0)); diff != "" || sum.Keys != int64(len(want)-1) {
		t.Fatalf("restore around the same key wrote %d keys, want %d (-backup +restored):\n%s", sum.Keys, len(want)-1, diff)
	}
}
