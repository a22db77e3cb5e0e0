package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"
)

var _ PageReader = (*Bolt)(nil)

// ReadPage implements PageReader. As ReadFrom, committed entries are read
// with one cursor in one read transaction and staged ones copied from
// memory; the walk stops at the first entry past maxBytes, so a page never
// copies more than maxBytes plus its first entry.
func (b *Bolt) ReadPage(stream string, offset uint64, limit int, maxBytes int) ([]Entry, error) {
	end := uint64(math.MaxUint64)
	if limit > 0 && uint64(limit) <= math.MaxUint64-offset {
		end = offset + uint64(limit)
	}
	committed := uint64(math.MaxUint64)
	var tail [][]byte
	var tailStart uint64

	b.mu.Lock()
	if err := b.usableLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if st := b.streams[stream]; st != nil {
		// As in ReadFrom: the committed length is taken before the read
		// transaction begins, so the transaction sees at least that many.
		committed = st.committed
		end = min(end, st.lenLocked())
		if offset >= end {
			b.mu.Unlock()
			return nil, nil
		}
		if end > committed {
			tailStart = max(offset, committed)
			tail = st.pending[tailStart-committed : end-committed : end-committed]
		}
	}
	b.mu.Unlock()

	var out []Entry
	total := 0
	// full reports that the next entry, of n bytes, does not fit; once it
	// is true the page ends there, so it never skips an entry.
	stopped := false
	full := func(n int) bool {
		stopped = stopped || maxBytes > 0 && len(out) > 0 && total+n > maxBytes
		return stopped
	}
	if stop := min(end, committed); offset < stop {
		err := b.db.View(func(tx *bolt.Tx) error {
			first := entryKey(stream, offset)
			prefix := first[:len(first)-8]
			c := tx.Bucket(bucketStreams).Cursor()
			for k, v := c.Seek(first); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
				if len(k) != len(first) {
					return fmt.Errorf("stream %q: malformed key %x", stream, k)
				}
				seq := binary.BigEndian.Uint64(k[len(prefix):])
				if seq >= stop || full(len(v)) {
					break
				}
				total += len(v)
				out = append(out, Entry{Seq: seq, Payload: append([]byte(nil), v...)})
			}
			return nil
		})
		if err != nil {
			return nil, b.readErr(err)
		}
	}
	if stopped {
		return out, nil
	}
	for i, p := range tail {
		if full(len(p)) {
			break
		}
		total += len(p)
		out = append(out, Entry{Seq: tailStart + uint64(i), Payload: append([]byte(nil), p...)})
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
