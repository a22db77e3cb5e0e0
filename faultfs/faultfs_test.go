package faultfs

import (
	"bytes"
	"errors"
	"io"
	iofs "io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/store/vfs"
)

func read(t *testing.T, fs *FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		t.Fatalf("Open(%s): %v", name, err)
	}
	n, _ := f.Size()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("ReadAt: %v", err)
	}
	return buf
}

// mkdir creates dir durably.
func mkdir(t *testing.T, fs *FS, dir string) {
	t.Helper()
	must(t, vfs.MkdirAll(fs, dir))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCrash_KeepsExactlyWhatWasSynced(t *testing.T) {
	fs := New()
	mkdir(t, fs, "/d")
	synced, err := fs.Create("/d/synced")
	must(t, err)
	_, err = synced.WriteAt([]byte("durable"), 0)
	must(t, err)
	must(t, synced.Sync())
	unlinked, err := fs.Create("/d/unlinked") // created after the dir sync
	must(t, fs.SyncDir("/d"))
	must(t, err)
	_ = unlinked
	unlinked2, err := fs.Create("/d/late")
	must(t, err)
	must(t, unlinked2.Sync())
	_, err = synced.WriteAt([]byte(" and lost"), 7)
	must(t, err)
	must(t, synced.Truncate(3))

	must(t, fs.Crash(nil))
	if got := read(t, fs, "/d/synced"); string(got) != "durable" {
		t.Fatalf("synced file after Crash = %q, want %q", got, "durable")
	}
	names, err := fs.List("/d")
	must(t, err)
	if diff := cmp.Diff([]string{"synced", "unlinked"}, names); diff != "" {
		t.Fatalf("names after Crash (-want +got):\n%s", diff)
	}
	if _, err := synced.WriteAt([]byte("x"), 0); !errors.Is(err, ErrStale) {
		t.Fatalf("write through a handle from before the crash = %v, want ErrStale", err)
	}
}

func TestCrash_RemoveIsDurableOnlyAfterSyncDir(t *testing.T) {
	fs := New()
	mkdir(t, fs, "/d")
	f, err := fs.Create("/d/a")
	must(t, err)
	must(t, f.Sync())
	must(t, fs.SyncDir("/d"))
	must(t, fs.Remove("/d/a"))
	must(t, fs.Crash(nil))
	if _, err := fs.Open("/d/a"); err != nil {
		t.Fatalf("a removed file without a dir sync is gone after Crash: %v", err)
	}
	must(t, fs.Remove("/d/a"))
	must(t, fs.SyncDir("/d"))
	must(t, fs.Crash(nil))
	if _, err := fs.Open("/d/a"); err == nil {
		t.Fatalf("a removed file with a dir sync came back after Crash")
	}
}

func TestCrash_TearsTheLastWriteAtARandomByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[int]bool{}
	for range 200 {
		fs := New()
		fs.SetModel(TornPrefix)
		mkdir(t, fs, "/d")
		f, err := fs.Create("/d/a")
		must(t, err)
		must(t, f.Preallocate(16))
		must(t, f.Sync())
		must(t, fs.SyncDir("/d"))
		_, err = f.WriteAt([]byte("abcdefgh"), 4)
		must(t, err)
		must(t, fs.Crash(rng))
		got := read(t, fs, "/d/a")
		n := len(bytes.TrimRight(got, "\x00")) - 4
		if n < 0 {
			n = 0
		}
		if len(got) != 16 || !bytes.Equal(got[4:4+n], []byte("abcdefgh")[:n]) {
			t.Fatalf("after a torn write: %q, want a prefix of the write", got)
		}
		seen[n] = true
	}
	if len(seen) < 5 {
		t.Fatalf("torn lengths seen: %v; want many", seen)
	}
}

func TestRule_FailAndCut(t *testing.T) {
	fs := New()
	mkdir(t, fs, "/d")
	f, err := fs.Create("/d/a")
	must(t, err)
	fs.SetRule(func(op Op) Action {
		if op.Kind == OpSync {
			return Fail
		}
		return None
	})
	if err := f.Sync(); !errors.Is(err, ErrInjected) {
		t.Fatalf("Sync under a failing rule = %v, want ErrInjected", err)
	}
	cutAt := fs.Ops() + 1
	fs.SetRule(CutAt(cutAt))
	_, err = f.WriteAt([]byte("x"), 0)
	must(t, err)
	if _, err := f.WriteAt([]byte("y"), 1); !errors.Is(err, ErrCut) {
		t.Fatalf("write at the cut = %v, want ErrCut", err)
	}
	if err := fs.SyncDir("/d"); !errors.Is(err, ErrCut) {
		t.Fatalf("op after the cut = %v, want ErrCut", err)
	}
	if op, ok := fs.CutOp(); !ok || op.Index != cutAt || op.Kind != OpWrite {
		t.Fatalf("CutOp = %v, %v; want the write at %d", op, ok, cutAt)
	}
	must(t, fs.Crash(nil))
	if err := fs.MkdirAll("/e"); err != nil {
		t.Fatalf("after Crash the FS works again: %v", err)
	}
}

func TestCrash_LosesADirectoryWhoseEntryWasNotSynced(t *testing.T) {
	fs := New()
	mkdir(t, fs, "/data")
	must(t, fs.MkdirAll("/data/wal"))
	f, err := fs.Create("/data/wal/seg")
	must(t, err)
	_, err = f.WriteAt([]byte("record"), 0)
	must(t, err)
	must(t, f.Sync())
	must(t, fs.SyncDir("/data/wal")) // the file's entry, not the directory's
	must(t, fs.Crash(nil))
	if _, err := fs.List("/data/wal"); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("List of a directory whose entry was never synced, after Crash = %v, want ErrNotExist", err)
	}
	if _, err := fs.Open("/data/wal/seg"); err == nil {
		t.Fatalf("a synced file in a lost directory survived Crash")
	}

	mkdir(t, fs, "/data/wal")
	f, err = fs.Create("/data/wal/seg")
	must(t, err)
	must(t, f.Sync())
	must(t, fs.SyncDir("/data/wal"))
	must(t, fs.Crash(nil))
	if _, err := fs.Open("/data/wal/seg"); err != nil {
		t.Fatalf("a synced file in a directory made durable by vfs.MkdirAll, after Crash: %v", err)
	}
}

func TestCrash_BlocksKeepsOrLosesEachChangedBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const blocks = 6
	seen := map[string]bool{}
	for range 300 {
		fs := New()
		fs.SetModel(Blocks)
		mkdir(t, fs, "/d")
		f, err := fs.Create("/d/a")
		must(t, err)
		must(t, f.Preallocate(blocks*BlockSize))
		must(t, f.Sync())
		must(t, fs.SyncDir("/d"))
		// One write across every block but the first, not synced.
		_, err = f.WriteAt(bytes.Repeat([]byte{'x'}, (blocks-1)*BlockSize-7), BlockSize+3)
		must(t, err)
		must(t, fs.Crash(rng))
		got := read(t, fs, "/d/a")
		if len(got) != blocks*BlockSize {
			t.Fatalf("size after Crash = %d, want %d", len(got), blocks*BlockSize)
		}
		var pattern []byte
		for b := range blocks {
			blk := got[b*BlockSize : (b+1)*BlockSize]
			switch {
			case bytes.Count(blk, []byte{0}) == BlockSize:
				pattern = append(pattern, '0')
			case b > 0 && bytes.Equal(bytes.Trim(blk, "\x00"), bytes.Repeat([]byte{'x'}, len(bytes.Trim(blk, "\x00")))):
				pattern = append(pattern, 'x')
			default:
				t.Fatalf("block %d after Crash is neither as synced nor as written: %q", b, blk)
			}
		}
		if pattern[0] != '0' {
			t.Fatalf("the unwritten first block changed: %s", pattern)
		}
		seen[string(pattern)] = true
	}
	// Not only prefixes: some kept block follows a lost one.
	holes := 0
	for p := range seen {
		if lost := strings.IndexByte(p[1:], '0'); lost >= 0 && strings.LastIndexByte(p, 'x') > lost+1 {
			holes++
		}
	}
	if len(seen) < 16 || holes == 0 {
		t.Fatalf("block patterns seen: %v; want many, some with a lost block before a kept one", seen)
	}
}

func TestCommit_CutTearsTheCommitOnTheOSFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "db")
	fs := New()
	mkdir(t, fs, dir)
	old := bytes.Repeat([]byte{'o'}, 3*4096)
	must(t, fs.Commit(path, func() error { return os.WriteFile(path, old, 0o600) }))
	// The entry is durable only after a sync of its directory.
	must(t, fs.Crash(nil))
	if _, err := os.Stat(path); !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("an external file whose entry was never synced, after Crash: %v, want it removed", err)
	}
	must(t, fs.Commit(path, func() error { return os.WriteFile(path, old, 0o600) }))
	must(t, fs.SyncDir(dir))
	fs.SetRule(CutAt(fs.Ops()))
	cur := bytes.Repeat([]byte{'n'}, 4*4096)
	if err := fs.Commit(path, func() error { return os.WriteFile(path, cur, 0o600) }); !errors.Is(err, ErrCut) {
		t.Fatalf("Commit at the cut = %v, want ErrCut", err)
	}
	if err := fs.Commit(path, func() error { t.Fatal("a commit after the cut ran"); return nil }); !errors.Is(err, ErrCut) {
		t.Fatalf("Commit after the cut = %v, want ErrCut", err)
	}
	must(t, fs.Crash(rand.New(rand.NewPCG(5, 6))))
	got, err := os.ReadFile(path)
	must(t, err)
	checkTornCommit(t, old, cur, got)

	// Over many crashes the torn commit takes every shape: the meta pages
	// old with data pages mixed, or the data new with the meta torn.
	rng := rand.New(rand.NewPCG(7, 8))
	oldMeta, torn := 0, 0
	for range 100 {
		fs := New()
		mkdir(t, fs, dir)
		must(t, fs.Commit(path, func() error { return os.WriteFile(path, old, 0o600) }))
		must(t, fs.SyncDir(dir))
		fs.SetRule(CutAt(fs.Ops()))
		cur := bytes.Repeat([]byte{'n'}, 4*4096)
		if err := fs.Commit(path, func() error { return os.WriteFile(path, cur, 0o600) }); !errors.Is(err, ErrCut) {
			t.Fatalf("Commit at the cut = %v, want ErrCut", err)
		}
		must(t, fs.Crash(rng))
		got, err := os.ReadFile(path)
		must(t, err)
		checkTornCommit(t, old, cur, got)
		meta := got[:2*4096]
		switch {
		case bytes.Equal(meta, old[:2*4096]):
			oldMeta++
		case !bytes.Equal(meta, cur[:2*4096]):
			torn++
		}
	}
	if oldMeta == 0 || torn == 0 {
		t.Fatalf("of 100 torn commits, %d kept the old meta pages and %d tore them; want some of each", oldMeta, torn)
	}
}

// checkTornCommit checks that every byte of got is old's, cur's or zero.
func checkTornCommit(t *testing.T, old, cur, got []byte) {
	t.Helper()
	if len(got) != len(cur) {
		t.Fatalf("size after a torn commit = %d, want the new size %d (bbolt syncs a growth first)", len(got), len(cur))
	}
	for i, c := range got {
		if (i >= len(old) || c != old[i]) && c != cur[i] && c != 0 {
			t.Fatalf("byte %d after a torn commit is %q: neither old nor new", i, c)
		}
	}
}

func TestCapacity_RefusesGrowthPastItAndChangesNothing(t *testing.T) {
	fs := New()
	fs.SetCapacity(100)
	mkdir(t, fs, "/d")
	f, err := fs.Create("/d/a")
	must(t, err)
	must(t, f.Preallocate(60))
	if n, err := fs.Available("/d"); err != nil || n != 40 {
		t.Fatalf("Available = %d, %v; want 40", n, err)
	}
	if _, err := f.WriteAt(make([]byte, 50), 55); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write past the capacity = %v, want ENOSPC", err)
	}
	if err := f.Preallocate(101); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Preallocate past the capacity = %v, want ErrNoSpace", err)
	}
	if n, _ := f.Size(); n != 60 {
		t.Fatalf("size after refused growth = %d, want 60", n)
	}
	_, err = f.WriteAt(make([]byte, 10), 50) // inside the file: no growth
	must(t, err)
}
