package faultfs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// failNextSync makes the next Sync or Commit fail the Linux way.
func failNextSync(fs *FS) {
	done := false // the rule runs under fs.mu
	fs.SetRule(func(op Op) Action {
		if !done && (op.Kind == OpSync || op.Kind == OpCommit) {
			done = true
			return FailSync
		}
		return None
	})
}

// A failed Sync marks the dirty pages clean: the page cache still serves
// them, a later Sync succeeds without writing them, and a Crash loses
// them; a write to one of them dirties it again, whole.
func TestFailSync_MarksDirtyPagesCleanUnwritten(t *testing.T) {
	fs := New()
	mkdir(t, fs, "/d")
	f, err := fs.Create("/d/a")
	must(t, err)
	must(t, fs.SyncDir("/d"))
	base := bytes.Repeat([]byte{'a'}, 3*PageSize)
	_, err = f.WriteAt(base, 0)
	must(t, err)
	must(t, f.Sync())

	// Dirty pages 1 and 2; the sync fails.
	_, err = f.WriteAt(bytes.Repeat([]byte{'b'}, PageSize+10), PageSize+5)
	must(t, err)
	failNextSync(fs)
	if err := f.Sync(); !errors.Is(err, ErrInjected) {
		t.Fatalf("Sync under FailSync = %v, want ErrInjected", err)
	}
	cached := read(t, fs, "/d/a")
	if cached[PageSize+5] != 'b' || cached[2*PageSize+14] != 'b' {
		t.Fatalf("after a failed sync the page cache no longer serves the write")
	}
	// A later sync succeeds and writes neither page; a write to page 2
	// makes it written, with the earlier bytes the cache holds there.
	must(t, f.Sync())
	_, err = f.WriteAt([]byte{'c'}, 2*PageSize+100)
	must(t, err)
	must(t, f.Sync())
	if got := read(t, fs, "/d/a"); got[PageSize+5] != 'b' || got[2*PageSize+100] != 'c' {
		t.Fatalf("the page cache lost bytes before a crash")
	}
	must(t, fs.Crash(nil))
	got := read(t, fs, "/d/a")
	want := bytes.Clone(cached)
	copy(want[PageSize:2*PageSize], base[PageSize:2*PageSize]) // page 1: never written
	want[2*PageSize+100] = 'c'                                 // page 2: written whole by the last sync
	if !bytes.Equal(got, want) {
		t.Fatalf("after the crash the file differs from what the syncs wrote (page 1 %q..., page 2 %q...)",
			got[PageSize:PageSize+8], got[2*PageSize:2*PageSize+16])
	}
}

// Over many crashes a stale page is gone or torn (per the Model), never
// anything but the disk's bytes or the unwritten ones.
func TestFailSync_StalePagesAreGoneOrTornAtACrash(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	kept, lost := 0, 0
	for range 200 {
		fs := New()
		mkdir(t, fs, "/d")
		f, err := fs.Create("/d/a")
		must(t, err)
		must(t, fs.SyncDir("/d"))
		_, err = f.WriteAt(bytes.Repeat([]byte{'x'}, 2*PageSize), 0)
		must(t, err)
		failNextSync(fs)
		if err := f.Sync(); !errors.Is(err, ErrInjected) {
			t.Fatalf("Sync = %v", err)
		}
		must(t, f.Sync())
		must(t, fs.Crash(rng))
		got := read(t, fs, "/d/a")
		for i, c := range got {
			if c != 'x' && c != 0 {
				t.Fatalf("byte %d after the crash is %q", i, c)
			}
		}
		if bytes.Count(got, []byte{'x'}) > 0 {
			kept++
		} else {
			lost++
		}
	}
	if kept == 0 || lost == 0 {
		t.Fatalf("of 200 crashes %d kept some of the stale pages and %d none; want some of each", kept, lost)
	}
}

// A Commit whose sync fails leaves its change in the operating system's
// file (a restarted process reads it) but not on disk: a later Commit
// writes only the pages it changes, and a Crash reverts the others.
func TestFailSync_CommitLeavesTheChangeInThePageCacheOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "db")
	fs := New()
	mkdir(t, fs, dir)
	old := bytes.Repeat([]byte{'o'}, 4*PageSize)
	must(t, fs.Commit(path, func() error { return os.WriteFile(path, old, 0o600) }))
	must(t, fs.SyncDir(dir))

	failed := bytes.Clone(old)
	copy(failed[0:], bytes.Repeat([]byte{'m'}, PageSize))          // a meta page
	copy(failed[2*PageSize:], bytes.Repeat([]byte{'n'}, PageSize)) // a data page
	failNextSync(fs)
	if err := fs.Commit(path, func() error { return os.WriteFile(path, failed, 0o600) }); !errors.Is(err, ErrInjected) {
		t.Fatalf("Commit under FailSync = %v, want ErrInjected", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, failed) {
		t.Fatalf("after a failed commit the file does not hold its change")
	}
	// The next commit changes page 1 only (the other meta page).
	next := bytes.Clone(failed)
	copy(next[PageSize:], bytes.Repeat([]byte{'p'}, PageSize))
	must(t, fs.Commit(path, func() error { return os.WriteFile(path, next, 0o600) }))
	must(t, fs.Crash(rand.New(rand.NewPCG(1, 2))))
	got, err := os.ReadFile(path)
	must(t, err)
	want := bytes.Clone(old)
	copy(want[PageSize:], next[PageSize:2*PageSize])
	if !bytes.Equal(got, want) {
		t.Fatalf("after the crash pages 0-3 start %q %q %q %q; want the failed commit's pages reverted, the later one's kept",
			got[0], got[PageSize], got[2*PageSize], got[3*PageSize])
	}
}

// Journaled, a Crash keeps a prefix of the unsynced creates and removes,
// in order: a remove then a create of one name may leave the remove
// alone, never the create alone.
func TestJournaled_CrashKeepsAPrefixOfNameChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	seen := map[string]int{}
	for range 200 {
		fs := New()
		fs.SetJournaled(true)
		mkdir(t, fs, "/d")
		f, err := fs.Create("/d/a")
		must(t, err)
		_, err = f.WriteAt([]byte("old"), 0)
		must(t, err)
		must(t, f.Sync())
		must(t, fs.SyncDir("/d"))
		must(t, fs.Remove("/d/a"))
		g, err := fs.Create("/d/b")
		must(t, err)
		must(t, g.Sync())
		must(t, fs.Crash(rng))
		names, err := fs.List("/d")
		must(t, err)
		key := strings.Join(names, ",")
		switch key {
		case "a", "", "b":
		default:
			t.Fatalf("after a crash /d holds %q: not a prefix of remove a, create b", key)
		}
		seen[key]++
	}
	if len(seen) != 3 {
		t.Fatalf("outcomes %v; want all three prefixes", seen)
	}
}

// failNextSyncDir makes the next SyncDir fail the Linux way.
func failNextSyncDir(fs *FS) {
	done := false // the rule runs under fs.mu
	fs.SetRule(func(op Op) Action {
		if !done && op.Kind == OpSyncDir {
			done = true
			return FailSync
		}
		return None
	})
}

// A failed SyncDir marks the directory's changes clean unwritten: the
// namespace still shows them, a later SyncDir succeeds without writing
// them, and a Crash loses them (a create gone, a remove undone), until a
// change in the directory dirties it again and the next SyncDir writes
// it whole.
func TestFailSync_ADirectorySyncLeavesItsChangesUnwritten(t *testing.T) {
	for _, dirtyAgain := range []bool{false, true} {
		fs := New()
		mkdir(t, fs, "/d")
		old, err := fs.Create("/d/old")
		must(t, err)
		must(t, old.Close())
		must(t, fs.SyncDir("/d"))
		f, err := fs.Create("/d/new")
		must(t, err)
		must(t, f.Close())
		must(t, fs.Remove("/d/old"))
		failNextSyncDir(fs)
		if err := fs.SyncDir("/d"); !errors.Is(err, ErrInjected) {
			t.Fatalf("SyncDir under FailSync = %v, want ErrInjected", err)
		}
		fs.SetRule(nil)
		if got, err := fs.List("/d"); err != nil || len(got) != 1 || got[0] != "new" {
			t.Fatalf("List after a failed SyncDir = %v, %v; want the page cache's [new]", got, err)
		}
		if dirtyAgain {
			g, err := fs.Create("/d/later")
			must(t, err)
			must(t, g.Close())
		}
		must(t, fs.SyncDir("/d"))
		must(t, fs.Crash(nil))
		got, err := fs.List("/d")
		must(t, err)
		want := "[old]"
		if dirtyAgain {
			want = "[later new]"
		}
		if s := fmt.Sprint(got); s != want {
			t.Errorf("dirtied again %v: after the crash /d holds %s, want %s", dirtyAgain, s, want)
		}
	}
}
