package logfirst_test

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltfmt"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/vfs"
)

var writeLayout = flag.Bool("write-layout", false, "write testdata/layout<N>.db.gz, the golden data file of the layout version this build writes, from goldenContent")

// goldenContent is what every golden data file holds: streams (one
// trimmed), values and byte values, written through the log-first store
// and checkpointed by its Close.
func goldenContent(t *testing.T, s *logfirst.Store) {
	t.Helper()
	for i := range uint64(10) {
		if _, err := s.Append("oplog/1", fmt.Appendf(nil, "transfer %d to alice", 100+i), i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range uint64(3) {
		if _, err := s.Append("outbox/1", fmt.Appendf(nil, "outbox %d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range map[string]uint64{"server/incarnation": 3, "token/1/e/0102": 1, "token/1/0/0304": 5} {
		if err := s.CAS(k, 0, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutBytes([]store.Bytes{{Key: "checkpoint/1", Value: []byte("a checkpoint")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Trim("oplog/1", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
}

// goldenState is what a store holding goldenContent reads.
type goldenState struct {
	Oplog, Outbox []store.Entry
	OplogFirst    uint64
	Values        []store.Value
	Checkpoint    string
}

func readGolden(t *testing.T, s interface {
	store.DurableStore
	store.Compactor
}) goldenState {
	t.Helper()
	var g goldenState
	var err error
	if g.OplogFirst, err = s.First("oplog/1"); err != nil {
		t.Fatal(err)
	}
	if g.Oplog, err = s.ReadFrom("oplog/1", g.OplogFirst, 0); err != nil {
		t.Fatal(err)
	}
	if g.Outbox, err = s.ReadFrom("outbox/1", 0, 0); err != nil {
		t.Fatal(err)
	}
	if g.Values, err = s.Scan(""); err != nil {
		t.Fatal(err)
	}
	ck, err := s.GetBytes("checkpoint/1")
	if err != nil {
		t.Fatal(err)
	}
	g.Checkpoint = string(ck)
	return g
}

func wantGolden() goldenState {
	g := goldenState{OplogFirst: 2, Checkpoint: "a checkpoint"}
	for i := uint64(2); i < 10; i++ {
		g.Oplog = append(g.Oplog, store.Entry{Seq: i, Payload: fmt.Appendf(nil, "transfer %d to alice", 100+i)})
	}
	for i := range uint64(3) {
		g.Outbox = append(g.Outbox, store.Entry{Seq: i, Payload: fmt.Appendf(nil, "outbox %d", i)})
	}
	g.Values = []store.Value{{Key: "server/incarnation", Value: 3}, {Key: "token/1/0/0304", Value: 5}, {Key: "token/1/e/0102", Value: 1}}
	return g
}

// goldenDir unpacks testdata/layout<version>.db.gz as the data file of a
// new data directory (as a restore leaves it: no log beside it).
func goldenDir(t *testing.T, version int) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", fmt.Sprintf("layout%d.db.gz", version)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, logfirst.DBFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLayout_WriteGolden writes the golden data file of the layout this
// build writes, under -write-layout only: run it once for a new layout
// version, never to silence a changed one.
func TestLayout_WriteGolden(t *testing.T) {
	if !*writeLayout {
		t.Skip("writes a golden file; run with -write-layout for a new layout version")
	}
	dir := t.TempDir()
	s := open(t, dir, logfirst.Options{})
	goldenContent(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, logfirst.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", fmt.Sprintf("layout%d.db.gz", boltfmt.LayoutVersion))
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLayout_EveryVersionOpensAndServes opens the golden data file of
// every layout version ever written: read-only (the offline tools: the
// file is read as it is and left byte for byte), then read-write (the
// daemon's start, which converts an older layout to the current one) and
// read again, and then read-only once more, where the offline check
// (boltstore.Store.Check, which verifies every checksum) passes.
func TestLayout_EveryVersionOpensAndServes(t *testing.T) {
	for v := 1; v <= boltfmt.LayoutVersion; v++ {
		t.Run(fmt.Sprintf("layout%d", v), func(t *testing.T) {
			dir := goldenDir(t, v)
			path := filepath.Join(dir, logfirst.DBFile)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			ro, err := logfirst.OpenReadOnly(dir, logfirst.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantGolden(), readGolden(t, ro)); diff != "" {
				t.Errorf("read-only open of layout %d (-want +got):\n%s", v, diff)
			}
			if err := ro.Close(); err != nil {
				t.Fatal(err)
			}
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
				t.Errorf("the read-only open changed the file (%v)", err)
			}
			s := open(t, dir, logfirst.Options{})
			if diff := cmp.Diff(wantGolden(), readGolden(t, s)); diff != "" {
				t.Errorf("read-write open of layout %d (-want +got):\n%s", v, diff)
			}
			if _, err := s.Append("outbox/1", []byte("outbox 3"), 3); err != nil {
				t.Fatal(err)
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			bt, err := boltstore.Open(path, boltstore.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := bt.Check(); err != nil {
				t.Errorf("Check after the read-write open of layout %d: %v", v, err)
			}
			if got, err := bt.ReadFrom("outbox/1", 3, 0); err != nil || len(got) != 1 || string(got[0].Payload) != "outbox 3" {
				t.Errorf("ReadFrom(outbox/1, 3) = %v, %v; want the append after the open", got, err)
			}
			if err := bt.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLayout_NewerVersionIsRefused: a data file of a layout this build
// does not know yet is refused by every open, read-only or not, with
// boltfmt.ErrNewerLayout, and left as it was.
func TestLayout_NewerVersionIsRefused(t *testing.T) {
	dir := goldenDir(t, boltfmt.LayoutVersion)
	path := filepath.Join(dir, logfirst.DBFile)
	setLayoutVersion(t, path, boltfmt.LayoutVersion+1)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := logfirst.Open(dir, logfirst.Options{}); !errors.Is(err, boltfmt.ErrNewerLayout) {
		if err == nil {
			s.Close()
		}
		t.Errorf("Open of layout %d = %v, want ErrNewerLayout", boltfmt.LayoutVersion+1, err)
	}
	if s, err := logfirst.OpenReadOnly(dir, logfirst.Options{}); !errors.Is(err, boltfmt.ErrNewerLayout) {
		if err == nil {
			s.Close()
		}
		t.Errorf("OpenReadOnly of layout %d = %v, want ErrNewerLayout", boltfmt.LayoutVersion+1, err)
	}
	if s, err := boltstore.Open(path, boltstore.Options{}); !errors.Is(err, boltfmt.ErrNewerLayout) {
		if err == nil {
			s.Close()
		}
		t.Errorf("boltstore.Open of layout %d = %v, want ErrNewerLayout", boltfmt.LayoutVersion+1, err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
		t.Errorf("a refused open changed the file (%v)", err)
	}
}

// setLayoutVersion writes layout version v into the data file at path,
// sealed as version 2 seals it (CRC-32C of "meta", a zero byte, the key
// and the value), as a later build would write it.
func setLayoutVersion(t *testing.T, path string, v int) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tab := crc32.MakeTable(crc32.Castagnoli)
	raw := binary.BigEndian.AppendUint32([]byte{byte(v)}, crc32.Checksum(append([]byte("meta\x00version"), byte(v)), tab))
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("version"), raw) }); err != nil {
		t.Fatal(err)
	}
}

// The start that upgrades a data file of layout version 1 (boltfmt.Lay,
// as after a restore of an old backup) is cut by a power failure at
// every one of its calls: the start after that reads the golden content.
func TestLayout_AnUpgradingStartSurvivesACutAtEveryCall(t *testing.T) {
	setup := func() (*faultfs.FS, string, logfirst.Options) {
		ffs := faultfs.New()
		dir := goldenDir(t, 1)
		path := filepath.Join(dir, logfirst.DBFile)
		// The golden file, as durable on the faultfs as it is on the disk.
		if err := vfs.MkdirAll(ffs, dir); err != nil {
			t.Fatal(err)
		}
		if err := ffs.Commit(path, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := ffs.SyncDir(dir); err != nil {
			t.Fatal(err)
		}
		opts := noCheckpoint
		opts.FS = ffs
		return ffs, dir, opts
	}
	ffs, dir, opts := setup()
	start := ffs.Ops()
	s, err := logfirst.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	logfirst.Abandon(s)
	calls := ffs.Ops() - start
	rng := rand.New(rand.NewPCG(uint64(calls), 29))
	for at := range calls + 1 {
		ffs, dir, opts := setup()
		ffs.SetRule(faultfs.CutAt(ffs.Ops() + at))
		if s, err := logfirst.Open(dir, opts); err == nil {
			logfirst.Abandon(s)
		}
		if err := ffs.Crash(rng); err != nil {
			t.Fatal(err)
		}
		s := open(t, dir, opts)
		if diff := cmp.Diff(wantGolden(), readGolden(t, s)); diff != "" {
			t.Fatalf("cut at call %d of %d of the upgrading start (-want +got):\n%s", at, calls, diff)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("cut at each of the upgrading start's %d calls", calls)
}
