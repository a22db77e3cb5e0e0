package offline_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/logfirst/logfirsttest"
)

// A data directory whose log was made durable and then lost, the whole
// wal/ or every segment in it, is refused by every offline tool with
// logfirst.ErrLogLost, as the daemon's start refuses it: reporting the
// bbolt file alone would hide the writes acknowledged after its
// checkpoint, and writing it alone would start over them.
func TestOfflineTools_ALostLog_AreErrLogLost(t *testing.T) {
	for _, lose := range logfirsttest.Losses {
		t.Run(lose, func(t *testing.T) {
			dir := t.TempDir()
			st, err := logfirst.Open(dir, logfirst.Options{SegmentSize: segmentSize})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.CAS("k", 0, 1); err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			logfirsttest.LoseLog(t, dir, lose)
			file := filepath.Join(dir, offline.StoreFile)
			before, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var opts offline.Options
			tools := map[string]func() error{
				"inspect": func() error { _, _, err := offline.Inspect(dir, opts); return err },
				"pending": func() error { _, err := offline.Pending(dir, opts); return err },
				"open writable": func() error {
					st, err := offline.OpenWritable(dir, opts)
					if err == nil {
						st.Close()
					}
					return err
				},
				"compact": func() error {
					_, err := offline.Compact(context.Background(), dir, opts, participant.Options{})
					return err
				},
				"backup": func() error { _, err := offline.Backup(dir, opts, io.Discard, nil); return err },
			}
			for name, tool := range tools {
				if err := tool(); !errors.Is(err, logfirst.ErrLogLost) {
					t.Errorf("%s on a lost log = %v, want logfirst.ErrLogLost", name, err)
				}
			}
			if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, before) {
				t.Errorf("the tools changed %s (%v)", file, err)
			}
			walDir := filepath.Join(dir, logfirst.WALDir)
			if _, err := os.Stat(walDir); lose == logfirsttest.Directory && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the tools made %s again (%v): a later start would no longer see the loss", walDir, err)
			}
		})
	}
}

// A power cut during the first start, after bbolt created the file and
// before the store's layout was committed into it, leaves a valid bbolt
// file without a bucket. The daemon's next start lays it out: the empty
// store. The read-only tools report that empty store without writing a
// byte, and the writers go on from it as the daemon would.
func TestOfflineTools_AFirstStartCutBeforeTheLayout_AreTheEmptyStore(t *testing.T) {
	dir := t.TempDir()
	ffs := faultfs.New()
	file := filepath.Join(dir, offline.StoreFile)
	commits := 0
	ffs.SetRule(func(op faultfs.Op) faultfs.Action {
		if op.Kind == faultfs.OpCommit && op.Path == file {
			if commits++; commits == 2 { // bbolt's creation, then the layout
				return faultfs.Cut
			}
		}
		return faultfs.None
	})
	if _, err := logfirst.Open(dir, logfirst.Options{FS: ffs, SegmentSize: segmentSize}); !errors.Is(err, faultfs.ErrCut) {
		t.Fatalf("Open cut at the layout's commit = %v, want faultfs.ErrCut", err)
	}
	// Without an rng nothing unsynced survives: the file as bbolt created it.
	if err := ffs.Crash(nil); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(file)
	if err != nil || len(before) == 0 {
		t.Fatalf("the crash left %d bytes of %s (%v); want bbolt's new file", len(before), file, err)
	}
	opts := offline.Options{LogFS: ffs, LogSegmentSize: segmentSize}

	ops := ffs.Ops()
	incarnation, reports, err := offline.Inspect(dir, opts)
	if err != nil || incarnation != 0 || len(reports) != 0 {
		t.Fatalf("Inspect = %d, %v, %v; want the empty store", incarnation, reports, err)
	}
	st, err := offline.OpenReadOnly(dir, opts)
	if err != nil {
		t.Fatalf("OpenReadOnly = %v; want the empty store", err)
	}
	if n, err := st.Len("s"); n != 0 || err != nil {
		t.Errorf("Len = %d, %v; want 0", n, err)
	}
	if v, err := st.ReadValue("k"); v != 0 || err != nil {
		t.Errorf("ReadValue = %d, %v; want 0", v, err)
	}
	if vs, err := st.Scan(""); len(vs) != 0 || err != nil {
		t.Errorf("Scan = %v, %v; want nothing", vs, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := offline.Pending(dir, opts); n != 0 || err != nil {
		t.Errorf("Pending = %d, %v; want 0", n, err)
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, before) || ffs.Ops() != ops {
		t.Fatalf("the read-only tools changed the directory (file changed: %v, %v; log calls %d, want %d)",
			!bytes.Equal(after, before), err, ffs.Ops(), ops)
	}

	var copy bytes.Buffer
	if _, err := offline.Backup(dir, opts, &copy, nil); err != nil {
		t.Fatalf("Backup = %v; want a copy of the empty store", err)
	}
	st, err = logfirst.Open(dir, logfirst.Options{FS: ffs, SegmentSize: segmentSize})
	if err != nil {
		t.Fatalf("Open after the tools: %v", err)
	}
	defer st.Close()
	if err := st.CAS("k", 0, 1); err != nil {
		t.Errorf("CAS on the empty store: %v", err)
	}
}
