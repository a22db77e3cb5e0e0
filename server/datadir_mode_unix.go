//go:build unix

package server

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"
)

// checkDataDirModes checks the modes of the data directory, the files in
// it and those of its subdirectories (wal/), before the store is opened:
//
//	who        may                          outcome
//	others     read or write a file         ErrDataDirExposed
//	others     write the directory          ErrDataDirExposed
//	others     list or enter a directory    warning (its files are checked)
//	group      anything                     warning, unless the group is
//	                                        the process's own (a Kubernetes
//	                                        fsGroup volume)
//
// Each says the mode and the fix. Symbolic links are not followed.
func checkDataDirModes(dir string, log zerolog.Logger) error {
	var exposed, warned []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && strings.Count(strings.TrimPrefix(path, dir), string(filepath.Separator)) > 1 {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		perm := info.Mode().Perm()
		switch {
		case d.IsDir() && perm&0o002 != 0, !d.IsDir() && perm&0o006 != 0:
			exposed = append(exposed, fmt.Sprintf("%s (%v)", path, perm))
		case perm&0o007 != 0, perm&0o070 != 0 && !ownGroup(info):
			warned = append(warned, fmt.Sprintf("%s (%v)", path, perm))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("server: data directory modes: %w", err)
	}
	if len(exposed) > 0 {
		return fmt.Errorf("%w: %s: other users may read or change it, and the store holds tokens whose replay returns participant secrets; run chmod -R go-rwx %s",
			ErrDataDirExposed, strings.Join(clipList(exposed), ", "), dir)
	}
	if len(warned) > 0 {
		log.Warn().Strs("paths", clipList(warned)).Int("count", len(warned)).Str("fix", "chmod -R go-rwx "+dir).
			Msg("the data directory is open to the group or lets others list it: the store holds tokens whose replay returns participant secrets; close it to the server's user")
	}
	return nil
}

// clipList keeps the first few of a list of paths for a message.
func clipList(paths []string) []string {
	const keep = 5
	if len(paths) <= keep {
		return paths
	}
	return append(paths[:keep:keep], fmt.Sprintf("and %d more", len(paths)-keep))
}
