package etcdstore

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/participantd/participantd/store"
)

// Runs (layout 2). A commit writes the entries of one stream of one scope
// as one key, a run, at the entry key of its first seq, sealed with the
// run tag (0x02) under that key:
//
//	count (uvarint) | count × payload length (uvarint) | count × entry
//	entry = payload | 0x01 | CRC-32C (as Seal) under the entry's own key
//
// so that every entry keeps the sum it had as a key of its own (layout 1),
// and the run's sum covers the count and the lengths. A value of layout
// 1 at an entry key (tag 0x01, the payload) is a run of one: a stream of
// either layout, or of both, is a sequence of runs whose first seqs are
// their keys, each starting where the one before ends.

// runOverhead bounds what a run adds beside its entries: its count and its
// sum.
const runOverhead = binary.MaxVarintLen32 + SealOverhead

// entryCost bounds what an entry of n bytes adds to a run: its length,
// its payload and its sum.
func entryCost(n int) int { return binary.MaxVarintLen32 + n + SealOverhead }

// runLens splits ents into runs of at most maxRun bytes each (a run holds
// at least one entry, whatever its size) and returns how many entries
// each run takes. The committer packs and writes with the same split.
func runLens(ents [][]byte, maxRun int) []int {
	var out []int
	size := 0
	for _, e := range ents {
		c := entryCost(len(e))
		if len(out) == 0 || size+c > maxRun {
			out = append(out, 0)
			size = runOverhead
		}
		out[len(out)-1]++
		size += c
	}
	return out
}

// sealRun returns the run of ents stored at key (an entry key of the
// store's prefix: its last 8 bytes are the first entry's seq), sealed.
func (s *Store) sealRun(key string, ents [][]byte) string {
	rel := key[len(s.lay.prefix):]
	first := binary.BigEndian.Uint64([]byte(key[len(key)-8:]))
	size := runOverhead
	for _, e := range ents {
		size += entryCost(len(e))
	}
	out := make([]byte, 0, size)
	out = binary.AppendUvarint(out, uint64(len(ents)))
	for _, e := range ents {
		out = binary.AppendUvarint(out, uint64(len(e)))
	}
	erel := []byte(rel)
	for i, e := range ents {
		binary.BigEndian.PutUint64(erel[len(erel)-8:], first+uint64(i))
		out = appendSealed(out, unsafe.String(&erel[0], len(erel)), e, sealTag)
	}
	sum := sealSum(rel, out, runTag)
	out = binary.BigEndian.AppendUint32(append(out, runTag), sum)
	return unsafe.String(&out[0], len(out))
}

// openRun returns the entries of the run stored at key (an entry key of
// the store's prefix: its prefix and 8 bytes), a layout 1 entry being a run of one. Every sum is
// checked, the run's and each entry's: a mismatch is a
// *store.ChecksumError, a run whose structure does not parse ErrCorrupt.
// The payloads are sub-slices of sealed.
func (s *Store) openRun(key string, sealed []byte) ([][]byte, error) {
	ents, _, err := openRun(s.lay.prefix, key[len(s.lay.prefix):], sealed)
	return ents, err
}

// RunEntries returns the entries of the value stored at rel, an entry key
// relative to root (a stream's prefix and 8 bytes, as Unseal takes it),
// every sum checked, and whether it is a run (false: a layout 1 entry,
// returned as a run of one). The payloads are sub-slices of sealed. It is
// for offline tools that read the stored keys themselves.
func RunEntries(root, rel string, sealed []byte) ([][]byte, bool, error) {
	if len(rel) < 8 {
		return nil, false, fmt.Errorf("%w: %w: entry key %q is shorter than its seq", store.ErrCorrupt, ErrCorrupt, rel)
	}
	return openRun(root, rel, sealed)
}

// openRun is RunEntries without the key's length check.
func openRun(root, rel string, sealed []byte) ([][]byte, bool, error) {
	body, tag, err := unsealTag(root, rel, sealed)
	if err != nil {
		return nil, false, err
	}
	if tag == sealTag {
		return [][]byte{body}, false, nil
	}
	ents, err := parseRun(root, rel, body)
	return ents, err == nil, err
}

// parseRun returns the entries of body, the verified body of the run at
// rel, each entry's sum checked.
func parseRun(root, rel string, body []byte) ([][]byte, error) {
	bad := func(what string) error {
		return fmt.Errorf("%w: %w: run %q: %s", store.ErrCorrupt, ErrCorrupt, rel, what)
	}
	count, n := binary.Uvarint(body)
	if n <= 0 || count == 0 || count > uint64(len(body)) {
		return nil, bad("no entry count")
	}
	off := n
	lens := make([]uint64, count)
	total := uint64(0)
	for i := range lens {
		l, n := binary.Uvarint(body[off:])
		if n <= 0 || l > uint64(len(body)) {
			return nil, bad(fmt.Sprintf("entry %d has no length", i))
		}
		lens[i], off = l, off+n
		total += l + SealOverhead
	}
	if total != uint64(len(body)-off) {
		return nil, bad(fmt.Sprintf("%d entries of %d bytes in %d", count, total, len(body)-off))
	}
	erel := []byte(rel)
	first := binary.BigEndian.Uint64(erel[len(erel)-8:])
	out := make([][]byte, count)
	for i, l := range lens {
		end := off + int(l) + SealOverhead
		binary.BigEndian.PutUint64(erel[len(erel)-8:], first+uint64(i))
		// The key is read in place (unsealTag copies it into an error).
		p, tag, err := unsealTag(root, unsafe.String(&erel[0], len(erel)), body[off:end])
		if err != nil {
			return nil, err
		}
		if tag != sealTag {
			return nil, bad(fmt.Sprintf("entry %d is tagged %#x", i, tag))
		}
		out[i], off = p, end
	}
	return out, nil
}

// runCount returns how many entries the run stored at key holds, every
// sum checked (openRun).
func (s *Store) runCount(key string, sealed []byte) (uint64, error) {
	ents, err := s.openRun(key, sealed)
	return uint64(len(ents)), err
}
