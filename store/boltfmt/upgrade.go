package boltfmt

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
)

// upgradeBatchBytes bounds the bytes of keys and values one upgrade
// transaction rewrites: bbolt holds every page a transaction dirties in
// memory until it commits, so converting a large file in one transaction
// would need memory in proportion to the file.
var upgradeBatchBytes = 16 << 20

// Lay lays out a new file, or checks an existing one's layout and brings
// it to the current version, in transactions run by update (a read-write
// open's, with bbolt's faults contained). A file of version 1 is sealed
// in place, a batch of at most upgradeBatchBytes per transaction, each
// recording how far it got (meta "upgrade"), so that an upgrade cut by a
// crash resumes where its last transaction committed and readers know,
// key by key, which values are sealed; the last transaction seals the
// meta bucket and writes the new version. A file of a newer version is
// ErrNewerLayout, with nothing written.
func Lay(update func(func(*bolt.Tx) error) error) error {
	var f format
	if err := update(func(tx *bolt.Tx) error {
		if err := InitLayout(tx); err != nil {
			return err
		}
		var err error
		f, err = formatOf(tx)
		return err
	}); err != nil {
		return err
	}
	for f.version < LayoutVersion {
		if err := update(func(tx *bolt.Tx) error {
			var err error
			f, err = upgradeStep(tx, upgradeBatchBytes)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// upgradeStep seals, in tx, up to budget bytes of the values of a
// version 1 file not sealed yet, and returns the file's format after it.
func upgradeStep(tx *bolt.Tx, budget int) (format, error) {
	f, err := formatOf(tx)
	if err != nil || f.version >= 2 {
		return f, err
	}
	bi, after := 0, []byte(nil)
	if f.upgrading {
		bi, after = f.upBucket, f.upKey
	}
	type kv struct{ k, v []byte }
	written := 0
	for ; bi < len(upgradeOrder); bi, after = bi+1, nil {
		name := upgradeOrder[bi]
		b := tx.Bucket(name)
		if b == nil {
			continue // no byte value was ever written
		}
		seed := bucketSum(name)
		c := b.Cursor()
		k, v := c.First()
		if after != nil {
			k, v = c.Seek(after)
			if k != nil && bytes.Equal(k, after) {
				k, v = c.Next()
			}
		}
		// Collected first: a cursor is not to be trusted across a Put.
		var batch []kv
		for ; k != nil && written < budget; k, v = c.Next() {
			if v == nil {
				continue // a nested bucket: not of this layout, Check reports it
			}
			batch = append(batch, kv{append([]byte(nil), k...), seal(seed, k, v)})
			written += len(k) + len(v)
		}
		switch {
		case bytes.Equal(name, bucketStreams):
			b = streamsBucket(tx)
		case bytes.Equal(name, bucketValues):
			b = valuesBucket(tx)
		default:
			b.FillPercent = appendFillPercent
		}
		for _, e := range batch {
			if err := b.Put(e.k, e.v); err != nil {
				return format{}, err
			}
		}
		if k != nil {
			// The budget ran out inside this bucket: record how far (an
			// empty key: none of it yet).
			last := []byte{}
			if len(batch) > 0 {
				last = batch[len(batch)-1].k
			}
			return format{version: 1, upgrading: true, upBucket: bi, upKey: last},
				tx.Bucket(bucketMeta).Put(keyUpgrade, seal(sumMeta, keyUpgrade, append([]byte{byte(bi)}, last...)))
		}
	}
	meta := tx.Bucket(bucketMeta)
	var batch []kv
	err = meta.ForEach(func(k, v []byte) error {
		if v != nil && !bytes.Equal(k, keyVersion) && !bytes.Equal(k, keyUpgrade) {
			batch = append(batch, kv{append([]byte(nil), k...), seal(sumMeta, k, v)})
		}
		return nil
	})
	if err != nil {
		return format{}, err
	}
	for _, e := range batch {
		if err := meta.Put(e.k, e.v); err != nil {
			return format{}, err
		}
	}
	if err := meta.Delete(keyUpgrade); err != nil {
		return format{}, err
	}
	return format{version: LayoutVersion}, meta.Put(keyVersion, encodeVersion(LayoutVersion))
}
