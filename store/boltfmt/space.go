package boltfmt

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Space is where the bytes of a bbolt data file go: what each bucket
// holds and how many pages it occupies, for an operator (participantctl
// inspect --space) asking why a file is as large as it is.
type Space struct {
	// FileBytes is the file's size; HighWaterBytes the end of its last
	// page in use, free pages included (bbolt never shrinks a file).
	FileBytes, HighWaterBytes int64
	PageSize                  int
	Buckets                   []BucketSpace
}

// ReadSpace fills sp's page size, high water mark and buckets from read
// transaction tx, walking every bucket; the caller sets FileBytes.
func ReadSpace(tx *bolt.Tx, sp *Space) error {
	sp.HighWaterBytes, sp.PageSize = tx.Size(), tx.DB().Info().PageSize
	return tx.ForEach(func(name []byte, bk *bolt.Bucket) error {
		s := bk.Stats()
		bs := BucketSpace{Name: string(name), Keys: s.KeyN, LeafInuse: int64(s.LeafInuse), LeafAlloc: int64(s.LeafAlloc),
			BranchInuse: int64(s.BranchInuse), BranchAlloc: int64(s.BranchAlloc), InlineInuse: int64(s.InlineBucketInuse)}
		byPrefix := map[string]*PrefixSpace{}
		streams := bytes.Equal(name, bucketStreams)
		err := bk.ForEach(func(k, v []byte) error {
			p := keyPrefix(k, streams)
			ps := byPrefix[p]
			if ps == nil {
				ps = &PrefixSpace{Prefix: p}
				byPrefix[p] = ps
			}
			ps.Keys++
			ps.KeyBytes += int64(len(k))
			ps.ValueBytes += int64(len(v))
			return nil
		})
		for _, ps := range byPrefix {
			bs.Prefixes = append(bs.Prefixes, *ps)
		}
		slices.SortFunc(bs.Prefixes, func(x, y PrefixSpace) int {
			return int((y.KeyBytes + y.ValueBytes) - (x.KeyBytes + x.ValueBytes))
		})
		sp.Buckets = append(sp.Buckets, bs)
		return err
	})
}

// BucketSpace is one bucket of a Space.
type BucketSpace struct {
	Name string
	Keys int
	// LeafInuse is the bytes of its leaf pages holding keys, values and
	// their headers; LeafAlloc the bytes of those pages. Likewise for the
	// branch pages above them.
	LeafInuse, LeafAlloc, BranchInuse, BranchAlloc int64
	// InlineInuse is the bytes of a bucket small enough that bbolt keeps
	// it inside its parent's page (no pages of its own).
	InlineInuse int64
	// Prefixes splits the keys by name up to the first '/' (for the
	// streams bucket, the stream's name), largest first.
	Prefixes []PrefixSpace
}

// PrefixSpace is the keys of a bucket sharing one prefix.
type PrefixSpace struct {
	Prefix               string
	Keys                 int
	KeyBytes, ValueBytes int64
}

// keyPrefix is the part of key k up to its first '/': of the stream's
// name in the streams bucket (2-byte length, name, seq).
func keyPrefix(k []byte, stream bool) string {
	if stream && len(k) >= 2 {
		if n := int(binary.BigEndian.Uint16(k)); 2+n <= len(k) {
			k = k[2 : 2+n]
		}
	}
	p, _, _ := strings.Cut(string(k), "/")
	return p
}

// PagesInUse is boltstore.Store.InUse as of read transaction tx: the file's high
// water mark less the pages bbolt's last write transaction left free or
// pending. For a store built on a bbolt file (logfirst).
func PagesInUse(tx *bolt.Tx) int64 {
	db := tx.DB()
	st := db.Stats()
	free := int64(st.FreePageN+st.PendingPageN) * int64(db.Info().PageSize)
	return max(tx.Size()-free, 0)
}
