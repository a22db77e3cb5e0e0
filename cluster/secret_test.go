package cluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/cluster"
)

func sealKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, cluster.SealKeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// nodeKeyOf starts node id on pfx with sealing key seal (nil: none) and
// returns what NodeKey says.
func nodeKeyOf(t *testing.T, pfx, id string, seal []byte) ([]byte, error) {
	t.Helper()
	ctx := context.Background()
	n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: id, Prefix: pfx, LeaseTTL: 5 * time.Second, SealKey: seal})
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	defer n.Close()
	return n.NodeKey(ctx)
}

// storedNodeKey is the cluster secret's value in etcd, as a reader of etcd
// (a backup of its data, a user with read access) sees it.
func storedNodeKey(t *testing.T, pfx string) []byte {
	t.Helper()
	resp, err := shared.Client.Get(context.Background(), pfx+cluster.NodeKeyName)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(%s) = %v, %v", pfx+cluster.NodeKeyName, resp, err)
	}
	// Under the checksum every value carries (cluster.SealRel).
	v, err := cluster.UnsealRel(cluster.NodeKeyName, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestNodeKey_SealedInEtcd: with a sealing key the cluster secret in etcd
// is sealed, not the key itself; every node with the same sealing key
// reads the same secret; a node without it, or with another, is refused.
func TestNodeKey_SealedInEtcd(t *testing.T) {
	pfx := "/sealed/"
	seal := sealKey(t)
	key, err := nodeKeyOf(t, pfx, "a", seal)
	if err != nil {
		t.Fatalf("NodeKey(a): %v", err)
	}
	stored := storedNodeKey(t, pfx)
	if bytes.Contains(stored, key) || len(stored) != 64 || !bytes.HasPrefix(stored, []byte("pdk1")) {
		t.Fatalf("stored secret = %x (%d bytes) for key %x, want it sealed: 64 bytes, pdk1, not the key", stored, len(stored), key)
	}
	if again, err := nodeKeyOf(t, pfx, "b", seal); err != nil || !bytes.Equal(again, key) {
		t.Fatalf("NodeKey(b, same sealing key) = %x, %v; want %x", again, err, key)
	}
	if _, err := nodeKeyOf(t, pfx, "c", nil); !errors.Is(err, cluster.ErrNodeKeySealed) {
		t.Fatalf("NodeKey(c, no sealing key) = %v, want ErrNodeKeySealed", err)
	}
	if got, err := nodeKeyOf(t, pfx, "d", sealKey(t)); err == nil || !strings.Contains(err.Error(), "does not open") {
		t.Fatalf("NodeKey(d, another sealing key) = %x, %v; want refused", got, err)
	}
}

// TestNodeKey_SealsAnUnsealedSecret: a cluster started without a sealing
// key keeps its secret (credentials stay valid) when a node with one
// starts: the secret is sealed in place, after which a node without the
// sealing key is refused.
func TestNodeKey_SealsAnUnsealedSecret(t *testing.T) {
	pfx := "/unsealed/"
	key, err := nodeKeyOf(t, pfx, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if stored := storedNodeKey(t, pfx); !bytes.Equal(stored, key) {
		t.Fatalf("without a sealing key the stored secret = %x, want the key %x", stored, key)
	}
	seal := sealKey(t)
	if got, err := nodeKeyOf(t, pfx, "b", seal); err != nil || !bytes.Equal(got, key) {
		t.Fatalf("NodeKey(b, sealing) = %x, %v; want the existing key %x", got, err, key)
	}
	if stored := storedNodeKey(t, pfx); bytes.Contains(stored, key) {
		t.Fatalf("after a sealing node started the stored secret is still the key")
	}
	if _, err := nodeKeyOf(t, pfx, "c", nil); !errors.Is(err, cluster.ErrNodeKeySealed) {
		t.Fatalf("NodeKey(c, no sealing key) after sealing = %v, want ErrNodeKeySealed", err)
	}
	if got, err := cluster.OpenNodeKey(seal, storedNodeKey(t, pfx)); err != nil || !bytes.Equal(got, key) {
		t.Fatalf("OpenNodeKey = %x, %v; want %x", got, err, key)
	}
}

func TestLoadSealKey(t *testing.T) {
	dir := t.TempDir()
	raw := sealKey(t)
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got, err := cluster.LoadSealKey(write("raw", raw, 0o600)); err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("LoadSealKey(raw) = %x, %v", got, err)
	}
	if got, err := cluster.LoadSealKey(write("hex", []byte(hex.EncodeToString(raw)+"\n"), 0o600)); err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("LoadSealKey(hex) = %x, %v", got, err)
	}
	for name, tc := range map[string]struct {
		b    []byte
		mode os.FileMode
		want string
	}{
		"readable": {raw, 0o644, "want 0600"},
		"short":    {raw[:16], 0o600, "want 32 bytes"},
		"bad hex":  {[]byte(strings.Repeat("zz", 32)), 0o600, "want 32 bytes"},
	} {
		if _, err := cluster.LoadSealKey(write(strings.ReplaceAll(name, " ", "_"), tc.b, tc.mode)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadSealKey(%s) = %v, want an error saying %q", name, err, tc.want)
		}
	}
}

// TestNodeKey_RotatesTheSealingKey (security item 7, left open last
// round): a node given the new sealing key and the previous one opens a
// secret sealed under the previous key and seals it again under the new,
// in place; the secret, and so every credential, is unchanged. After that
// the new key alone opens it and the previous alone does not; a node with
// the previous key as current and an unrelated one as previous is
// refused, as is one given a previous key that opens nothing.
func TestNodeKey_RotatesTheSealingKey(t *testing.T) {
	pfx := "/rotate/"
	old, fresh := sealKey(t), sealKey(t)
	key, err := nodeKeyOf(t, pfx, "a", old)
	if err != nil {
		t.Fatal(err)
	}
	rotate := func(id string, seal, previous []byte) ([]byte, error) {
		t.Helper()
		ctx := context.Background()
		n, err := cluster.Start(ctx, shared.Client, cluster.Options{NodeID: id, Prefix: pfx, LeaseTTL: 5 * time.Second, SealKey: seal, PreviousSealKey: previous})
		if err != nil {
			t.Fatalf("Start(%s): %v", id, err)
		}
		defer n.Close()
		return n.NodeKey(ctx)
	}
	if _, err := rotate("x", fresh, sealKey(t)); err == nil {
		t.Fatalf("a node whose two keys are both unrelated opened the secret")
	}
	if got, err := rotate("b", fresh, old); err != nil || !bytes.Equal(got, key) {
		t.Fatalf("NodeKey(new, previous) = %x, %v; want the secret %x unchanged", got, err, key)
	}
	stored := storedNodeKey(t, pfx)
	if got, err := cluster.OpenNodeKey(fresh, stored); err != nil || !bytes.Equal(got, key) {
		t.Fatalf("after the rotation the new key opens %x, %v; want %x", got, err, key)
	}
	if _, err := cluster.OpenNodeKey(old, stored); err == nil {
		t.Fatalf("after the rotation the previous key still opens the stored secret")
	}
	if got, err := rotate("c", fresh, old); err != nil || !bytes.Equal(got, key) {
		t.Fatalf("a second node with both keys = %x, %v; want %x", got, err, key)
	}
	if !bytes.Equal(storedNodeKey(t, pfx), stored) {
		t.Errorf("a node with both keys re-sealed a secret already sealed under the new one")
	}
	if _, err := nodeKeyOf(t, pfx, "d", old); err == nil {
		t.Errorf("a node with only the previous key opened the rotated secret")
	}
	if got, err := nodeKeyOf(t, pfx, "e", fresh); err != nil || !bytes.Equal(got, key) {
		t.Errorf("a node with only the new key = %x, %v; want %x", got, err, key)
	}
}
