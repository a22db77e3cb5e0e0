package cluster

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/participantd/participantd/participant"
)

// The cluster secret (secret/node-key) derives every attach secret and
// invitation. Stored as it is, whoever can read etcd (a backup of etcd's
// data directory, an etcd user with read access to the prefix) can mint
// credentials. With a sealing key (Options.SealKey, a file the operator
// keeps beside the nodes' other secrets), it is stored sealed: AES-256-GCM
// under that key, with the key's name as additional data, so that a sealed
// value opens only as the node key and only with the operator's file.
//
// A sealed value is sealMagic, a 12-byte nonce, then the 32 sealed bytes
// and GCM's 16-byte tag: 64 bytes. An unsealed value is the 32 bytes
// themselves; the two lengths tell them apart before the magic does.

// Rotation. A node given the sealing key being rotated out as
// Options.PreviousSealKey, besides the new SealKey, opens a secret sealed
// under either and seals one under the previous key again under the new,
// in place (a compare on the value's revision): give every node both
// files, restart them one by one (the first re-seals, the others open it
// under the new key), then drop the previous key's file. The secret itself
// does not change, so no credential or invitation does.

// NodeKeyName is the cluster secret's key, relative to the prefix.
const NodeKeyName = "secret/node-key"

// SealKeySize is the size of a sealing key.
const SealKeySize = 32

const sealMagic = "pdk1"

// ErrNodeKeySealed is returned when the cluster secret in etcd is sealed
// and no sealing key was given.
var ErrNodeKeySealed = errors.New("the cluster secret in etcd is sealed: give the sealing key (--etcd-secret-key-file) its nodes were started with")

// LoadSealKey reads a sealing key from path: 32 bytes, or 64 hexadecimal
// digits and an optional newline (`openssl rand -hex 32`). Like node.key,
// the file must not be readable by others, nor by its group unless that
// is the process's own group and may only read it (a Kubernetes Secret
// mounted with fsGroup: 0440, group-owned by the pod's group).
func LoadSealKey(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: sealing key: %w", err)
	}
	if perm := info.Mode().Perm(); perm&0o007 != 0 || perm&0o070 != 0 && (perm&0o030 != 0 || !ownGroup(info)) {
		return nil, fmt.Errorf("cluster: sealing key %s has mode %v, want 0600 (it opens the cluster secret)", path, info.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: sealing key: %w", err)
	}
	if len(b) == SealKeySize {
		return b, nil
	}
	if h := bytes.TrimSuffix(b, []byte("\n")); len(h) == 2*SealKeySize {
		key := make([]byte, SealKeySize)
		if _, err := hex.Decode(key, h); err == nil {
			return key, nil
		}
	}
	return nil, fmt.Errorf("cluster: sealing key %s: want %d bytes, or %d hexadecimal digits (openssl rand -hex %d)", path, SealKeySize, 2*SealKeySize, SealKeySize)
}

func sealAEAD(sealKey []byte) (cipher.AEAD, error) {
	if len(sealKey) != SealKeySize {
		return nil, fmt.Errorf("cluster: sealing key has %d bytes, want %d", len(sealKey), SealKeySize)
	}
	block, err := aes.NewCipher(sealKey)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// sealNodeKey returns key sealed under sealKey.
func sealNodeKey(sealKey, key []byte) ([]byte, error) {
	aead, err := sealAEAD(sealKey)
	if err != nil {
		return nil, err
	}
	out := make([]byte, len(sealMagic)+aead.NonceSize(), len(sealMagic)+aead.NonceSize()+len(key)+aead.Overhead())
	copy(out, sealMagic)
	nonce := out[len(sealMagic):]
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(out, nonce, key, []byte(NodeKeyName)), nil
}

// sealed reports whether stored is a sealed node key.
func sealed(stored []byte) bool {
	return len(stored) != participant.NodeKeySize && bytes.HasPrefix(stored, []byte(sealMagic))
}

// openNodeKey is OpenNodeKey that also tries previous, the sealing key
// being rotated out, when sealKey does not open stored; current reports
// that stored is sealed under sealKey, as it should stay.
func openNodeKey(sealKey, previous, stored []byte) (key []byte, current bool, err error) {
	key, err = OpenNodeKey(sealKey, stored)
	if err == nil {
		return key, sealed(stored), nil
	}
	if previous == nil || !sealed(stored) {
		return nil, false, err
	}
	if key, perr := OpenNodeKey(previous, stored); perr == nil {
		return key, false, nil
	}
	return nil, false, errors.New("cluster: neither the sealing key nor the previous one opens the cluster secret in etcd: it was sealed under another key")
}

// OpenNodeKey returns the cluster secret from its stored value: opened
// with sealKey when it is sealed (ErrNodeKeySealed without one), as it is
// when it is not.
func OpenNodeKey(sealKey, stored []byte) ([]byte, error) {
	if !sealed(stored) {
		if len(stored) != participant.NodeKeySize {
			return nil, fmt.Errorf("cluster: the node key in etcd is malformed (%d bytes)", len(stored))
		}
		return stored, nil
	}
	if sealKey == nil {
		return nil, ErrNodeKeySealed
	}
	aead, err := sealAEAD(sealKey)
	if err != nil {
		return nil, err
	}
	rest := stored[len(sealMagic):]
	if len(rest) < aead.NonceSize() {
		return nil, errors.New("cluster: the sealed node key in etcd is malformed")
	}
	key, err := aead.Open(nil, rest[:aead.NonceSize()], rest[aead.NonceSize():], []byte(NodeKeyName))
	if err != nil {
		return nil, errors.New("cluster: the sealing key does not open the cluster secret in etcd: it was sealed under another key")
	}
	if len(key) != participant.NodeKeySize {
		return nil, fmt.Errorf("cluster: the sealed node key holds %d bytes, want %d", len(key), participant.NodeKeySize)
	}
	return key, nil
}
