//go:build !unix

package server

import (
	"os"
	"time"

	"github.com/rs/zerolog"
)

// lockDataDir has no flock here; the store's own file lock (taken by
// bbolt when the store opens, before the node key is read or created)
// keeps a second server out instead.
func lockDataDir(dir string, timeout time.Duration) (*os.File, error) {
	return nil, nil
}

// checkDataDirModes checks nothing where file modes do not say who may
// read a file.
func checkDataDirModes(string, zerolog.Logger) error { return nil }
