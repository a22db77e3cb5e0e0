package participant

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// NodeKeySize is the size of the node key secrets are derived from.
const NodeKeySize = 32

// NodeKeyFile is the node key's file name inside the data directory.
const NodeKeyFile = "node.key"

// secretDomain separates attach secrets from any other use of the node key.
const secretDomain = "participantd.attach-secret.v1\x00"

// deriveSecret computes the attach secret of one credential:
//
//	HMAC-SHA256(node key, domain ‖ conversation nonce ‖ conversation ‖ participant ‖ generation)
//
// Secrets are never stored: a replay or a verification re-derives them.
// The nonce (random, from the conversation's genesis row) keeps a recreated
// data directory that reuses the node key from minting the same secrets.
func deriveSecret(key []byte, nonce [16]byte, c ConversationID, p ParticipantID, g Generation) Secret {
	mac := hmac.New(sha256.New, key)
	var buf [len(secretDomain) + 16 + 24]byte
	n := copy(buf[:], secretDomain)
	n += copy(buf[n:], nonce[:])
	binary.BigEndian.PutUint64(buf[n:], uint64(c))
	binary.BigEndian.PutUint64(buf[n+8:], uint64(p))
	binary.BigEndian.PutUint64(buf[n+16:], uint64(g))
	mac.Write(buf[:])
	var s Secret
	mac.Sum(s[:0])
	return s
}

// verifySecret reports, in constant time, whether s is the secret of the
// credential (c, p, g).
func verifySecret(key []byte, nonce [16]byte, c ConversationID, p ParticipantID, g Generation, s Secret) bool {
	want := deriveSecret(key, nonce, c, p, g)
	return hmac.Equal(want[:], s[:])
}

// LoadOrCreateNodeKey returns the node key kept in dir/node.key, creating
// it on first start. A key file of the wrong size, or readable by others,
// is an error: a leaked or truncated key would make every credential
// forgeable or void.
//
// Creation is exclusive, so that concurrent callers (two processes starting
// on a fresh directory) all return the key that ends up on disk: the key is
// written to a temp file of its own, fsync'd, then linked to node.key with
// link(2), which fails if node.key exists; a caller that loses reads the
// winner's key. The directory is fsync'd before the key is returned, and
// the key returned is the one read back from node.key. The daemon calls it
// with the data directory locked; the link keeps it safe without.
func LoadOrCreateNodeKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, NodeKeyFile)
	key, err := readNodeKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := createNodeKey(dir, path); err != nil {
		return nil, err
	}
	return readNodeKey(path)
}

// readNodeKey reads and checks the key file at path. A missing file is an
// error wrapping fs.ErrNotExist.
func readNodeKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("participant: node key %s has mode %v, want 0600", path, info.Mode().Perm())
	}
	if info.Size() != NodeKeySize {
		return nil, fmt.Errorf("participant: node key %s has %d bytes, want %d", path, info.Size(), NodeKeySize)
	}
	key := make([]byte, NodeKeySize)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("participant: node key %s: %w", path, err)
	}
	return key, nil
}

// createNodeKey creates path with a new random key unless it exists; it
// returns nil in both cases once path is durable.
func createNodeKey(dir, path string) error {
	key := make([]byte, NodeKeySize)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("participant: node key: %w", err)
	}
	// A temp name of its own: a shared one would let two creators write
	// into the same file.
	f, err := os.CreateTemp(dir, NodeKeyFile+".tmp-*")
	if err != nil {
		return fmt.Errorf("participant: node key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, werr := f.Write(key)
	merr := f.Chmod(0o600)
	// The key's bytes must be durable before the name that makes it the
	// node key exists, or a crash could leave an empty node.key.
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, merr, serr, cerr); err != nil {
		return fmt.Errorf("participant: node key: %w", err)
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("participant: node key: %w", err)
	}
	// Drop the temp name before the directory fsync, so that one fsync
	// makes both the new name durable and the temp one gone. The key must
	// be durable under its final name before any secret derived from it
	// is handed out.
	os.Remove(tmp)
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("participant: node key: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("participant: node key: sync %s: %w", dir, err)
	}
	return nil
}
