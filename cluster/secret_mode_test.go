//go:build unix

package cluster_test

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/participantd/participantd/cluster"
)

// Issue 27 item 5: a Kubernetes Secret mounted with fsGroup is 0440,
// group-owned by the pod's own group; the sealing key is read from one.
// Group write, another group, or others' access stay refused.
func TestLoadSealKey_OwnGroupMayRead(t *testing.T) {
	raw := sealKey(t)
	write := func(mode os.FileMode) string {
		p := filepath.Join(t.TempDir(), "seal-key")
		if err := os.WriteFile(p, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write(0o440)
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil || int(st.Gid) != os.Getegid() {
		t.Skipf("the temporary directory gives its files group %d, not the process's %d", st.Gid, os.Getegid())
	}
	if got, err := cluster.LoadSealKey(p); err != nil || !bytes.Equal(got, raw) {
		t.Errorf("LoadSealKey of a 0440 file of the process's group = %x, %v; want the key", got, err)
	}
	for _, mode := range []os.FileMode{0o460, 0o444, 0o404, 0o640 | 0o010} {
		if _, err := cluster.LoadSealKey(write(mode)); err == nil || !strings.Contains(err.Error(), "want 0600") {
			t.Errorf("LoadSealKey of a %v file = %v, want a refusal", mode, err)
		}
	}
}
