package participant

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
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
// the file (mode 0600, fsync'd, then the directory fsync'd) on first start.
// A key file of the wrong size, or readable by others, is an error: a
// leaked or truncated key would make every credential forgeable or void.
func LoadOrCreateNodeKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, NodeKeyFile)
	key, err := os.ReadFile(path)
	switch {
	case err == nil:
		info, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("participant: node key: %w", err)
		}
		if info.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("participant: node key %s has mode %v, want 0600", path, info.Mode().Perm())
		}
		if len(key) != NodeKeySize {
			return nil, fmt.Errorf("participant: node key %s has %d bytes, want %d", path, len(key), NodeKeySize)
		}
		return key, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	key = make([]byte, NodeKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	_, werr := f.Write(key)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	// The key must be durable under its final name before any secret
	// derived from it is handed out.
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("participant: node key: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return nil, fmt.Errorf("participant: node key: sync %s: %w", dir, err)
	}
	return key, nil
}
