package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/participantd/participantd/client"
)

// readCreds reads the credential file at path.
func readCreds(path string) (client.Credential, error) {
	var c client.Credential
	if path == "" {
		return c, errors.New("--creds is required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read credentials: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("read credentials %s: %w", path, err)
	}
	return c, nil
}

// writeCreds replaces the credential file at path atomically: the new
// content goes to a temporary file in the same directory, mode 0600, which is
// fsync'd and renamed over path, then the directory is fsync'd. A crash
// leaves either the old file or the new one, never a torn one; and the new
// credential is durable before the caller relies on it (the old one no
// longer attaches once the server minted the new one).
func writeCreds(path string, c client.Credential) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("write credentials: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write credentials: %w", err)
	}
	// The content must be durable before the rename makes it the file.
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write credentials: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	// The rename must be durable before the credential is used.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write credentials: fsync %s: %w", dir, err)
	}
	return nil
}
