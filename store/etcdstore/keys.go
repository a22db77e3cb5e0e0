package etcdstore

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/participantd/participantd/store"
)

// Key layout under Options.Prefix (see doc.go). A name is written raw in
// the floor and value keys, which hold one key per name, and behind a
// 2-byte big-endian length in entry (run) keys, so that one stream's runs
// are one key range that no other stream's runs can fall into (a stream
// named "a/…" must not sort between the runs of "a"). Layout 1 also kept
// a length key per stream (l/), which layout 2 neither reads nor writes.
const (
	kindEntry = 's'
	kindValue = 'v'
	kindBytes = 'b'
	kindFloor = 'f'
)

// layout builds the etcd keys of one store.
type layout struct {
	prefix string
	scope  func(name string) string
}

// scopeOf returns the scope of name; "" is the global scope.
func (l layout) scopeOf(name string) string {
	if l.scope == nil {
		return ""
	}
	sc := l.scope(name)
	if strings.ContainsRune(sc, '/') {
		// A scope is one key segment; anything else is treated as global
		// rather than allowed to overlap another scope's range.
		return ""
	}
	return sc
}

// base returns the key prefix of everything of scope sc.
func (l layout) base(sc string) string {
	if sc == "" {
		return l.prefix + "g/"
	}
	return l.prefix + "c/" + sc + "/"
}

// ScopePrefix returns the key prefix that holds every stream and value of
// scope sc: one range to read, list or delete.
func (l layout) ScopePrefix(sc string) string { return l.base(sc) }

// floorKey is the key of stream name's trim floor: the seq below which
// its entries are compacted, though a run straddling it keeps some.
func (l layout) floorKey(sc, name string) string {
	return l.base(sc) + string(kindFloor) + "/" + name
}

func (l layout) valueKey(sc, name string) string {
	return l.base(sc) + string(kindValue) + "/" + name
}

// bytesKey is the key of byte value name (store.Compactor).
func (l layout) bytesKey(sc, name string) string {
	return l.base(sc) + string(kindBytes) + "/" + name
}

// entryPrefix is the prefix of every entry (run) key of stream name.
func (l layout) entryPrefix(sc, name string) string {
	var n [2]byte
	binary.BigEndian.PutUint16(n[:], uint16(len(name)))
	return l.base(sc) + string(kindEntry) + "/" + string(n[:]) + name
}

// runSeq returns the first seq of the run at key, a key of entry prefix
// prefix, or ErrCorrupt when key is not prefix and 8 bytes.
func runSeq(prefix string, key []byte) (uint64, error) {
	if len(key) != len(prefix)+8 || string(key[:len(prefix)]) != prefix {
		return 0, fmt.Errorf("%w: %w: malformed entry key %q", store.ErrCorrupt, ErrCorrupt, key)
	}
	return binary.BigEndian.Uint64(key[len(prefix):]), nil
}

func entryKey(prefix string, seq uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return prefix + string(b[:])
}

// valueName parses a key of the store's prefix and returns the name of the
// value it holds, or false when the key is not a value key.
func (l layout) valueName(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, l.prefix)
	if !ok {
		return "", false
	}
	switch {
	case strings.HasPrefix(rest, "g/"):
		rest = rest[2:]
	case strings.HasPrefix(rest, "c/"):
		i := strings.IndexByte(rest[2:], '/')
		if i < 0 {
			return "", false
		}
		rest = rest[2+i+1:]
	default:
		return "", false
	}
	return strings.CutPrefix(rest, string(kindValue)+"/")
}

func decodeU64(b []byte) (uint64, bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
