package logfirst

import (
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
)

// Backup writes a consistent bbolt file holding every batch logged before
// it was called to w, while the store serves; the file alone is a whole
// store (Open of a directory holding only it starts a new log after its
// checkpoint LSN). begin, if not nil, is told the file's size before any
// byte is written. It returns the bytes written.
//
// It first checkpoints every logged batch, then copies bbolt from one read
// transaction (Tx.WriteTo). No batch can be lost between the two:
//
//   - Every Flush answered before Backup was called covers a record at or
//     below the lastLSN Backup reads first (a commit sets lastLSN before
//     it answers its Flushes).
//   - The forced checkpoint applies the whole logged layer, which is every
//     record up to a lastLSN at least that large, in one bbolt transaction
//     that also stores that LSN.
//   - The read transaction starts after that commit, so it sees bbolt at
//     that checkpoint or a later one. Checkpoints only move forward and
//     each applies every record up to its LSN; one that commits while the
//     copy is written changes new pages only (bbolt keeps a read
//     transaction's pages until it ends), so the copy is exactly one
//     checkpoint's state. Backup checks the copied checkpoint LSN against
//     the one it needs and fails rather than return a short copy.
//
// Writes staged but not flushed are not in the copy, and no answered
// operation is missing from it. An error of w is returned as is and the
// store stays usable; a failed checkpoint is the store's sticky error. A
// read-only store fails with ErrReadOnly (its log tail is in memory only).
func (s *Store) Backup(w io.Writer, begin store.BackupSize) (int64, error) {
	if s.readOnly {
		return 0, ErrReadOnly
	}
	// Close waits for the backup to finish before it closes the files;
	// once closed is set, the backup does not start.
	s.filesMu.RLock()
	defer s.filesMu.RUnlock()
	s.mu.Lock()
	err := s.usableLocked()
	need := s.lastLSN
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := s.checkpoint(); err != nil {
		return 0, err
	}
	var n int64
	err = s.view(func(tx *bolt.Tx) error {
		ck, err := checkpointLSN(tx)
		if err != nil {
			return err
		}
		if ck < need {
			return fmt.Errorf("checkpoint LSN %v is below the %v logged when the backup began", ck, need)
		}
		if begin != nil {
			begin(tx.Size())
		}
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("logfirst: backup of %s: %w", s.db.Path(), err)
	}
	return n, nil
}
