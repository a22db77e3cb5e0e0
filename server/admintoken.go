package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// AdminTokenFile is the file of the data directory where a server started
// with Config.LocalAdminToken, no AdminToken and a loopback health
// listener writes the admin token it generated (mode 0600, one line), for
// participantctl on the same host to find. Reading it takes what reading
// the data directory takes (its node.key and store are there too), and
// the endpoints it opens are reachable from this host only.
const AdminTokenFile = "admin-token"

// generateAdminToken returns 32 random bytes in hex.
func generateAdminToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("server: generate admin token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// publishAdminToken writes the generated admin token to the data
// directory's AdminTokenFile, or, when this server generated none,
// removes a file an earlier start left, whose token no longer opens
// anything. The file is written to a temporary name and renamed, so that a
// reader sees the old token or the new one, never a part.
func (s *Server) publishAdminToken() error {
	path := filepath.Join(s.cfg.DataDir, AdminTokenFile)
	if !s.adminTokenGenerated {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("server: remove stale %s: %w", path, err)
		}
		return nil
	}
	if err := os.MkdirAll(s.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: admin token file: %w", err)
	}
	f, err := os.CreateTemp(s.cfg.DataDir, AdminTokenFile+".*.tmp") // mode 0600
	if err != nil {
		return fmt.Errorf("server: admin token file: %w", err)
	}
	tmp := f.Name()
	_, err = f.WriteString(s.cfg.AdminToken + "\n")
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("server: admin token file %s: %w", path, err)
	}
	return nil
}
