package backup_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/cluster/backup"
)

// TestBackup_ADamagedValueIsRefusedBeforeARestoreWrites: a value damaged
// in etcd (one bit flipped in the node's ordinal, written by a node of
// this version) is copied as it is into a backup, whose own SHA-256 then
// covers the damage: Check refuses the file by the value's own checksum,
// and Restore writes nothing from it. An intact backup checks and
// restores.
func TestBackup_ADamagedValueIsRefusedBeforeARestoreWrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := shared.Prefix()
	n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: "a", Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodeKey(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	export := func() []byte {
		t.Helper()
		var buf bytes.Buffer
		if _, err := backup.Export(ctx, shared.Client.KV, p, &buf, backup.Options{}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	intact := export()
	if _, err := backup.Check(bytes.NewReader(intact)); err != nil {
		t.Fatalf("Check of an intact backup: %v", err)
	}
	resp, err := shared.Client.Get(ctx, p+"ordinal/a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(ordinal/a) = %v, %v", resp, err)
	}
	v := bytes.Clone(resp.Kvs[0].Value)
	v[0] ^= 0x02 // "1" reads "3"
	if _, err := shared.Client.Put(ctx, p+"ordinal/a", string(v)); err != nil {
		t.Fatal(err)
	}
	damaged := export()
	if _, err := backup.Check(bytes.NewReader(damaged)); !errors.Is(err, backup.ErrCorrupt) {
		t.Fatalf("Check of a backup holding a damaged value = %v, want ErrCorrupt", err)
	}
	q := shared.Prefix()
	if _, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(damaged), backup.RestoreOptions{}); !errors.Is(err, backup.ErrCorrupt) {
		t.Fatalf("Restore of a backup holding a damaged value = %v, want ErrCorrupt", err)
	}
	if r, err := shared.Client.Get(ctx, q, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Fatalf("the refused restore wrote %v keys (%v)", r.Count, err)
	}
	if _, err := backup.Restore(ctx, shared.Client.KV, q, bytes.NewReader(intact), backup.RestoreOptions{}); err != nil {
		t.Fatalf("Restore of the intact backup: %v", err)
	}

	// A prefix that kept its node key from before checksums (bare) takes
	// the backup's sealed copy of the same key: one format in the prefix,
	// and no ErrNodeKeyDiffers for the same key.
	sealed, err := shared.Client.Get(ctx, p+backup.NodeKeyKey)
	if err != nil || len(sealed.Kvs) != 1 {
		t.Fatalf("Get(node key) = %v, %v", sealed, err)
	}
	bare, err := cluster.UnsealRel(backup.NodeKeyKey, sealed.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	kept := shared.Prefix()
	if _, err := shared.Client.Put(ctx, kept+backup.NodeKeyKey, string(bare)); err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Restore(ctx, shared.Client.KV, kept, bytes.NewReader(intact), backup.RestoreOptions{}); err != nil {
		t.Fatalf("Restore beside the same node key before checksums: %v", err)
	}
	got, err := shared.Client.Get(ctx, kept+backup.NodeKeyKey)
	if err != nil || len(got.Kvs) != 1 || !bytes.Equal(got.Kvs[0].Value, sealed.Kvs[0].Value) {
		t.Fatalf("node key after the restore = %v, %v; want the backup's sealed copy", got, err)
	}
}
