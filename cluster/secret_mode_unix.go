//go:build unix

package cluster

import (
	"os"
	"syscall"
)

// ownGroup reports whether info's file belongs to the group the process
// runs as: a Kubernetes Secret mounted with fsGroup is group-owned by the
// pod's own group and group-readable (0440), and only the pod runs in it.
func ownGroup(info os.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == os.Getegid()
}
