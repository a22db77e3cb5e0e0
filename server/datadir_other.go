//go:build !unix

package server

import (
	"os"
	"time"
)

// lockDataDir has no flock here; the store's own file lock (taken by
// bbolt when the store opens, before the node key is read or created)
// keeps a second server out instead.
func lockDataDir(dir string, timeout time.Duration) (*os.File, error) {
	return nil, nil
}
