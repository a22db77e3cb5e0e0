package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
)

// The offline tools read a stopped server's data directory. They open the
// store, read it and close it: they never Append, CAS or Flush, so the
// data is exactly as the server left it.
//
// Until package participant exports its reconciliation, reconcileDry below
// mirrors participant's reconcile step for step, with the same classes.

// storeFile is the store's file name inside the data directory, as
// cmd/participantd/server.StoreFile names it.
const storeFile = "participantd.db"

// offlineLockTimeout is how long to wait for the data file's lock: a running
// server holds it for good, so waiting long only delays the diagnosis.
const offlineLockTimeout = 200 * time.Millisecond

func addDataFlag(fs *flag.FlagSet) *string {
	return fs.String("data", "./data", "the stopped server's data directory")
}

// openData opens the store of data directory dir for reading. It refuses
// a directory without a store (store.Open would create one) and reports a
// running server (store.ErrLocked) plainly.
func openData(dir string) (*store.Bolt, error) {
	path := filepath.Join(dir, storeFile)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no store in %s: %w", dir, err)
	}
	st, err := store.Open(path, store.Options{LockTimeout: offlineLockTimeout})
	if errors.Is(err, store.ErrLocked) {
		return nil, fmt.Errorf("%s is in use: stop participantd first (the offline tools need the data at rest): %w", dir, err)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// registryVersion is the version byte of a registry entry.
const registryVersion = 1

// readRegistry returns every registered conversation once, in registration
// order, as participant reads it.
func readRegistry(st store.DurableStore) ([]oplog.ConversationID, error) {
	entries, err := st.ReadFrom(participant.RegistryStream, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("read registry: %w", err)
	}
	seen := make(map[oplog.ConversationID]bool, len(entries))
	var ids []oplog.ConversationID
	for _, e := range entries {
		if len(e.Payload) != 9 || e.Payload[0] != registryVersion {
			return nil, fmt.Errorf("registry entry %d is unreadable (%d bytes): the server would refuse to start", e.Seq, len(e.Payload))
		}
		id := oplog.ConversationID(binary.BigEndian.Uint64(e.Payload[1:]))
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// refusal is a finding that makes a conversation unloadable.
type refusal struct {
	Class  string `json:"class"`
	Reason string `json:"reason"`
}

// dryRun is what reconciling one conversation would do.
type dryRun struct {
	oplogRows  int
	outboxRows int
	state      *outbox.State // nil when refused
	repairs    int           // outbox rows that would be appended
	refused    *refusal
}

// reconcileDry reconciles conversation c without writing: it validates the
// whole outbox, replays the oplog through outbox.Project, matches every
// stored outbox row byte for byte and counts the expected rows missing at
// the end. A storage failure is returned as an error.
func reconcileDry(st store.DurableStore, c oplog.ConversationID) (*dryRun, error) {
	oplogRows, err := readStream(st, oplog.Stream(c))
	if err != nil {
		return nil, err
	}
	stored, err := readStream(st, outbox.Stream(c))
	if err != nil {
		return nil, err
	}
	r := &dryRun{oplogRows: len(oplogRows), outboxRows: len(stored)}
	refuse := func(class, format string, args ...any) (*dryRun, error) {
		r.state, r.repairs = nil, 0
		r.refused = &refusal{class, fmt.Sprintf(format, args...)}
		return r, nil
	}
	rows, err := outbox.Validate(stored)
	switch {
	case errors.Is(err, outbox.ErrMixedVersion):
		return refuse(participant.ClassOutboxMixedVersion, "%v", err)
	case errors.Is(err, outbox.ErrUnknownVersion):
		return refuse(participant.ClassOutboxUnknownVersion, "%v", err)
	case err != nil:
		return refuse(participant.ClassOutboxCorrupt, "%v", err)
	}
	for i := range rows {
		if rows[i].Source >= uint64(len(oplogRows)) {
			return refuse(participant.ClassImpossibleBoundary,
				"impossible future boundary: outbox row %d derives from oplog row %d, the oplog has %d rows",
				i, rows[i].Source, len(oplogRows))
		}
	}
	state := &outbox.State{}
	matched := 0
	for i, b := range oplogRows {
		row, err := oplog.Decode(b)
		if err != nil {
			return refuse(participant.ClassOplogCorrupt, "oplog row %d: %v", i, err)
		}
		expected, err := outbox.Project(state, uint64(i), &row)
		if err != nil {
			return refuse(participant.ClassOplogInconsistent, "oplog row %d: %v", i, err)
		}
		for k := range expected {
			enc, err := outbox.Encode(&expected[k])
			if err != nil {
				return nil, fmt.Errorf("encode expected outbox row: %w", err)
			}
			if matched < len(stored) {
				if !bytes.Equal(enc, stored[matched]) {
					return refuse(participant.ClassOutboxConflict,
						"outbox row %d differs from the row oplog row %d projects", matched, i)
				}
				matched++
				continue
			}
			r.repairs++
		}
		outbox.Apply(state, uint64(i), &row, expected)
	}
	if matched < len(stored) {
		return refuse(participant.ClassOutboxConflict, "outbox has %d rows, the oplog projects %d", len(stored), matched)
	}
	r.state = state
	return r, nil
}

// readPage is how many entries one store read returns.
const readPage = 4096

func readStream(st store.DurableStore, stream string) ([][]byte, error) {
	var out [][]byte
	for {
		entries, err := st.ReadFrom(stream, uint64(len(out)), readPage)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", stream, err)
		}
		for _, e := range entries {
			out = append(out, e.Payload)
		}
		if len(entries) < readPage {
			return out, nil
		}
	}
}
