package faultfs

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCrash_KeepsExactlyWhatWasSynced(t *testing.T) {
	fs := New()
	must(t, fs.MkdirAll("/d"))
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

	fs.Crash(nil)
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
	must(t, fs.MkdirAll("/d"))
	f, err := fs.Create("/d/a")
	must(t, err)
	must(t, f.Sync())
	must(t, fs.SyncDir("/d"))
	must(t, fs.Remove("/d/a"))
	fs.Crash(nil)
	if _, err := fs.Open("/d/a"); err != nil {
		t.Fatalf("a removed file without a dir sync is gone after Crash: %v", err)
	}
	must(t, fs.Remove("/d/a"))
	must(t, fs.SyncDir("/d"))
	fs.Crash(nil)
	if _, err := fs.Open("/d/a"); err == nil {
		t.Fatalf("a removed file with a dir sync came back after Crash")
	}
}

func TestCrash_TearsTheLastWriteAtARandomByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[int]bool{}
	for range 200 {
		fs := New()
		must(t, fs.MkdirAll("/d"))
		f, err := fs.Create("/d/a")
		must(t, err)
		must(t, f.Preallocate(16))
		must(t, f.Sync())
		must(t, fs.SyncDir("/d"))
		_, err = f.WriteAt([]byte("abcdefgh"), 4)
		must(t, err)
		fs.Crash(rng)
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
	must(t, fs.MkdirAll("/d"))
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
	fs.Crash(nil)
	if err := fs.MkdirAll("/e"); err != nil {
		t.Fatalf("after Crash the FS works again: %v", err)
	}
}
