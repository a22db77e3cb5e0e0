//go:build unix

package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockDataDir takes an exclusive flock on dir/LOCK, waiting up to timeout
// while another holder has it (a previous server still draining). The lock
// is held until the returned file is closed, and released by the kernel if
// the process dies.
func lockDataDir(dir string, timeout time.Duration) (*os.File, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server: data directory lock: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("server: data directory lock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%w: %s held for %v", ErrDataDirLocked, path, timeout)
		}
		time.Sleep(lockPollInterval)
	}
}

// ownGroup reports whether info's file belongs to the group the process
// runs as (a Kubernetes volume given to the pod's fsGroup is).
func ownGroup(info os.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == os.Getegid()
}
