//go:build unix

package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/store/logfirst"
)

// Issue 27 item 6: a data directory that other users may read is refused
// at start, saying the mode and the fix; one they may only list, or that
// its group may read, is warned about.
func TestOpenDataDir_ModesChecked(t *testing.T) {
	open := func(t *testing.T, dir string) (string, error) {
		t.Helper()
		var logs strings.Builder
		d, err := openDataDir(dir, Config{Engine: EngineLog}, zerolog.New(&logs))
		if err == nil {
			d.Close()
		}
		return logs.String(), err
	}
	fresh := func(t *testing.T) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "data")
		if logs, err := open(t, dir); err != nil || strings.Contains(logs, "open to the group") {
			t.Fatalf("a fresh data directory: %v, %s", err, logs)
		}
		return dir
	}
	segment := func(t *testing.T, dir string) string {
		t.Helper()
		segs, err := filepath.Glob(filepath.Join(dir, logfirst.WALDir, "*.wal"))
		if err != nil || len(segs) == 0 {
			t.Fatalf("no log segment in %s: %v", dir, err)
		}
		return segs[0]
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string) string // returns the path it opened
		refuse bool
	}{
		{"store file readable by others", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, StoreFile)
			chmod(t, p, 0o644)
			return p
		}, true},
		{"log segment writable by others", func(t *testing.T, dir string) string {
			p := segment(t, dir)
			chmod(t, p, 0o602)
			return p
		}, true},
		{"directory writable by others", func(t *testing.T, dir string) string {
			chmod(t, dir, 0o777)
			return dir
		}, true},
		{"directory others may list", func(t *testing.T, dir string) string {
			chmod(t, dir, 0o755)
			return dir
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fresh(t)
			path := tc.change(t, dir)
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			logs, err := open(t, dir)
			if !tc.refuse {
				if err != nil || !strings.Contains(logs, "open to the group or lets others list it") || !strings.Contains(logs, path) || !strings.Contains(logs, "chmod -R go-rwx") {
					t.Errorf("open = %v, logs %s; want a start with a warning naming %s and the fix", err, logs, path)
				}
				return
			}
			if !errors.Is(err, ErrDataDirExposed) || !strings.Contains(err.Error(), path) ||
				!strings.Contains(err.Error(), info.Mode().Perm().String()) || !strings.Contains(err.Error(), "chmod -R go-rwx "+dir) {
				t.Fatalf("open = %v, want ErrDataDirExposed naming %s, its mode %v and the fix", err, path, info.Mode().Perm())
			}
			// The fix it names works.
			err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				return os.Chmod(p, info.Mode().Perm()&^0o077)
			})
			if err != nil {
				t.Fatal(err)
			}
			if logs, err := open(t, dir); err != nil || strings.Contains(logs, "open to") {
				t.Errorf("after chmod -R go-rwx: %v, %s", err, logs)
			}
		})
	}
	t.Run("the process's own group", func(t *testing.T) {
		dir := fresh(t)
		chmod(t, dir, 0o2770) // a Kubernetes fsGroup volume's root
		chmod(t, filepath.Join(dir, StoreFile), 0o660)
		var st syscall.Stat_t
		if syscall.Stat(dir, &st) != nil || int(st.Gid) != os.Getegid() {
			t.Skip("the temporary directory's group is not the process's")
		}
		if logs, err := open(t, dir); err != nil || strings.Contains(logs, "open to") {
			t.Errorf("group access by the process's own group: %v, %s; want a quiet start", err, logs)
		}
	})
	t.Run("another group", func(t *testing.T) {
		// A supplementary group of the process, else any other (which
		// root, as in a container, may give a file too).
		other := os.Getegid() + 1
		groups, err := os.Getgroups()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			if g != os.Getegid() {
				other = g
			}
		}
		dir := fresh(t)
		p := filepath.Join(dir, StoreFile)
		if err := os.Chown(p, -1, other); err != nil {
			t.Skipf("the process may not give a file another group: %v", err)
		}
		chmod(t, p, 0o640)
		if logs, err := open(t, dir); err != nil || !strings.Contains(logs, p) {
			t.Errorf("a store file another group may read: %v, %s; want a start with a warning naming it", err, logs)
		}
	})
}

// chmod sets path's mode, failing t if it cannot.
func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
