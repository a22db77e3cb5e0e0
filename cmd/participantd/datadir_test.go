package main

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/server/servertest"
	"github.com/participantd/participantd/store/boltstore"
)

// servedDataDir returns a data directory a server on engine has run on
// and stopped.
func servedDataDir(t *testing.T, engine string) string {
	t.Helper()
	dir := t.TempDir()
	if err := servertest.Start(t, server.Config{DataDir: dir, Engine: engine}).Stop(); err != nil {
		t.FailNow() // Stop reported Run's error
	}
	return dir
}

// runDaemon runs participantd on dir with --store engine, expecting it to
// refuse to start, and returns its exit status and what it logged.
func runDaemon(t *testing.T, dir, engine string) (int, string) {
	t.Helper()
	return runRefused(t, "--data", dir, "--store", engine)
}

// runRefused runs participantd with args, on loopback ports of its own,
// expecting it to refuse to start, and returns its exit status and what it
// logged.
func runRefused(t *testing.T, args ...string) (int, string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	code := make(chan int, 1)
	go func() {
		code <- run(append(args, "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"), nil, io.Discard, logf)
	}()
	select {
	case c := <-code:
		out, err := os.ReadFile(logf.Name())
		if err != nil {
			t.Fatal(err)
		}
		return c, string(out)
	case <-time.After(30 * time.Second):
		t.Fatalf("participantd %s did not refuse to start", strings.Join(args, " "))
		return 0, ""
	}
}

func truncateStore(t *testing.T, dir string, size func(file int64) int64) {
	t.Helper()
	path := filepath.Join(dir, server.StoreFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size(fi.Size())); err != nil {
		t.Fatal(err)
	}
}

func TestRun_DamagedOrLostDataRefusedExit1(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   []string
	}{
		{"store 0 bytes beside node.key", func(t *testing.T, dir string) {
			truncateStore(t, dir, func(int64) int64 { return 0 })
		}, []string{"empty (0 bytes)", "node.key exists", "backup"}},
		{"store missing beside node.key", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, server.StoreFile)); err != nil {
				t.Fatal(err)
			}
		}, []string{"does not exist", "node.key exists", "backup"}},
		{"store truncated to half", func(t *testing.T, dir string) {
			// Half of the pages in use: the file may be longer than its
			// high water mark (bbolt grows it ahead by its AllocSize), so
			// half of the file may cut nothing that is used.
			_, hwm := storeMeta(t, dir)
			truncateStore(t, dir, func(int64) int64 { return int64(hwm/2) * 4096 })
		}, []string{"damaged", "truncated", "backup"}},
		{"store one page short", func(t *testing.T, dir string) {
			_, hwm := storeMeta(t, dir)
			truncateStore(t, dir, func(int64) int64 { return int64(hwm-1) * 4096 })
		}, []string{"damaged", "backup"}},
		{"meta pages flipped", func(t *testing.T, dir string) {
			path := filepath.Join(dir, server.StoreFile)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			raw[16+56] ^= 0x01      // page 0's txid
			raw[4096+16+56] ^= 0x01 // page 1's
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"damaged", "both meta pages are invalid", "backup"}},
		{"branch page points past the file", func(t *testing.T, dir string) {
			path := filepath.Join(dir, server.StoreFile)
			st, err := boltstore.Open(path, boltstore.Options{MustExist: true})
			if err != nil {
				t.Fatal(err)
			}
			for i := uint64(0); i < 2000; i++ {
				if _, err := st.Append("pad", make([]byte, 200), i); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			_, hwm := storeMeta(t, dir)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for id := uint64(2); id < hwm; id++ {
				p := raw[id*4096 : (id+1)*4096]
				if binary.LittleEndian.Uint64(p) == id && binary.LittleEndian.Uint16(p[8:]) == 0x01 {
					binary.LittleEndian.PutUint64(p[16+8:], 1<<40) // first child
					n++
				}
			}
			if n == 0 {
				t.Fatal("no branch page")
			}
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"damaged", "outside pages", "backup"}},
		{"node.key missing beside a served store", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, participant.NodeKeyFile)); err != nil {
				t.Fatal(err)
			}
		}, []string{"node.key is missing", "restore"}},
	} {
		// The log-first store checks and contains its bbolt file as
		// boltstore.Open does: the same refusals, the same messages.
		for _, engine := range []string{server.EngineBolt, server.EngineLog} {
			t.Run(engine+"/"+tc.name, func(t *testing.T) {
				dir := servedDataDir(t, engine)
				tc.damage(t, dir)
				code, logged := runDaemon(t, dir, engine)
				if code != 1 {
					t.Errorf("participantd exit = %d, want 1; logged %s", code, logged)
				}
				for _, w := range tc.want {
					if !strings.Contains(logged, w) {
						t.Errorf("participantd logged %q, want %q in it", logged, w)
					}
				}
			})
		}
	}
}

// storeMeta returns the txid and high water mark of the meta page bbolt
// uses (the higher txid of pages 0 and 1 of a 4 KiB-page file).
func storeMeta(t *testing.T, dir string) (txid, hwm uint64) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, server.StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{16, 4096 + 16} {
		if tx := binary.LittleEndian.Uint64(raw[off+48:]); tx >= txid {
			txid, hwm = tx, binary.LittleEndian.Uint64(raw[off+40:])
		}
	}
	return txid, hwm
}

// TestRun_InterruptedFirstStartStarts covers a first start cut after the
// store was created and before node.key was: the store was never served
// (incarnation 0), so the next start creates the key and serves.
func TestRun_InterruptedFirstStartStarts(t *testing.T) {
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, server.StoreFile), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := servertest.Start(t, server.Config{DataDir: dir}).Stop(); err != nil {
		t.FailNow() // Stop reported Run's error
	}
	if _, err := os.Stat(filepath.Join(dir, participant.NodeKeyFile)); err != nil {
		t.Errorf("node.key after the start: %v", err)
	}
}
