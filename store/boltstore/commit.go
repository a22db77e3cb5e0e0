package boltstore

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/internal/stage"
)

// Flush implements store.DurableStore with group commit. A Flush with writes
// staged waits for the next commit, which carries the writes of every Flush
// that arrived before it began; a Flush with nothing staged waits only for a
// commit in progress (it may carry writes that returned before this call),
// and returns nil at once when there is none. After a failed commit Flush
// returns the sticky error (wrapping store.ErrFailed); after Close, store.ErrClosed.
func (b *Store) Flush() error {
	b.mu.Lock()
	if err := b.usableLocked(); err != nil {
		b.mu.Unlock()
		return err
	}
	b.flushes.Add(1)
	bt, wake := b.group.JoinLocked(b.streams.DirtyLocked() || b.vals.StagedLocked())
	waiting := b.hooks.flushWaiting
	b.mu.Unlock()

	if bt == nil {
		return nil
	}
	if wake {
		b.group.Kick()
	}
	if waiting != nil {
		waiting()
	}
	return bt.Wait()
}

// run is the committer goroutine: it commits one batch per wake until Close.
func (b *Store) run() {
	defer close(b.done)
	b.group.Run(&b.mu, b.quit, b.commit)
}

// commit writes every staged write in one bbolt transaction and finishes
// the next batch with the result. Only the committer goroutine calls it, so at most
// one commit is in progress.
func (b *Store) commit() {
	b.mu.Lock()
	bt := b.group.TakeLocked()
	if bt == nil {
		b.mu.Unlock()
		return
	}
	if err := b.usableLocked(); err != nil {
		b.group.EndLocked()
		b.mu.Unlock()
		bt.Finish(err)
		return
	}
	// Everything staged now goes into this commit; writes staged from here
	// on wait for the next one. Sequence numbers stay gap-free because each
	// stream's pending payloads are taken as a prefix and trimmed only
	// after the transaction succeeded.
	streams := make([]streamWrite, 0, b.streams.DirtyCountLocked())
	b.streams.TakeDirtyLocked(func(name string, st *boltStream) {
		n := len(st.pending)
		streams = append(streams, streamWrite{name: name, st: st, first: st.committed, payloads: st.pending[:n:n]})
	})
	// Keys go into the B+tree in order, so the cursor of each Put starts
	// near the last one and each leaf is split at most once.
	slices.SortFunc(streams, func(x, y streamWrite) int { return strings.Compare(x.name, y.name) })
	values := b.vals.TakeStagedLocked()
	h := b.hooks
	b.mu.Unlock()

	if h.beforeCommit != nil {
		h.beforeCommit()
	}
	// db.Update returns nil only after bbolt fsync'd the data pages and then
	// the meta page: from then on the batch survives a crash.
	// A damaged page bbolt trips on while it writes fails the commit
	// (contain), which makes the store sticky-failed like any other.
	err := boltfmt.Contain(b.path, func() error {
		return b.db.Update(func(tx *bolt.Tx) error {
			if h.commitErr != nil {
				if err := h.commitErr(); err != nil {
					return err
				}
			}
			return writeBatch(tx, streams, values)
		})
	})

	b.mu.Lock()
	b.group.EndLocked()
	if err != nil {
		b.err = fmt.Errorf("%w: commit to %s: %w", store.ErrFailed, b.path, err)
		err = b.err
	} else {
		for _, w := range streams {
			n := len(w.payloads)
			w.st.committed += uint64(n)
			w.st.pending = stage.DropFront(w.st.pending, n)
		}
		// bbolt now holds these values: they leave the layer, and so does
		// every value read from the file, so that it holds only keys with
		// writes in flight or read lately, and does not grow with every key
		// ever written (a token index has one per operation).
		b.vals.LandLocked(values)
		b.commits.Add(1)
	}
	b.mu.Unlock()
	bt.Finish(err)
}

// streamWrite is the part of one stream a commit writes.
type streamWrite struct {
	name     string
	st       *boltStream
	first    uint64   // seq of payloads[0]
	payloads [][]byte // never modified
}

// writeBatch writes streams and values in tx.
func writeBatch(tx *bolt.Tx, streams []streamWrite, values map[string]stage.Write) error {
	for _, w := range streams {
		// A stream's length in the file must be where the commit starts;
		// anything else means the in-memory state is broken.
		if err := boltfmt.PutEntries(tx, w.name, w.first, w.payloads); err != nil {
			return err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if err := boltfmt.PutValue(tx, k, values[k].Value); err != nil {
			return err
		}
	}
	return nil
}
