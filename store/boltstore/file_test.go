package boltstore_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
)

// buildFile makes a closed data file whose streams bucket spans many pages
// (so that it has branch pages) and returns its path.
func buildFile(t *testing.T) string {
	t.Helper()
	return buildFileWith(t, boltstore.Options{})
}

// buildFileWith is buildFile writing with opts.
func buildFileWith(t *testing.T, opts boltstore.Options) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data.db")
	b, err := boltstore.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("p"), 200)
	for i := uint64(0); i < 2000; i++ {
		if _, err := b.Append("s", payload, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.CAS("k", 0, 7); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(raw)
}

func TestBolt_OpenReadOnly_ReadsWithoutWriting(t *testing.T) {
	path := buildFile(t)
	before := fileSum(t, path)
	b, err := boltstore.Open(path, boltstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("Open(ReadOnly) error: %v", err)
	}
	if n, err := b.Len("s"); err != nil || n != 2000 {
		t.Errorf("Len(s) = %d, %v; want 2000", n, err)
	}
	if v, err := b.ReadValue("k"); err != nil || v != 7 {
		t.Errorf("ReadValue(k) = %d, %v; want 7", v, err)
	}
	if err := b.Check(); err != nil {
		t.Errorf("Check() = %v, want nil", err)
	}
	if _, err := b.Append("s", []byte("x"), 2000); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("Append on a read-only store = %v, want ErrReadOnly", err)
	}
	if err := b.CAS("k", 7, 8); !errors.Is(err, store.ErrReadOnly) {
		t.Errorf("CAS on a read-only store = %v, want ErrReadOnly", err)
	}
	if err := b.Flush(); err != nil {
		t.Errorf("Flush with nothing staged = %v, want nil", err)
	}
	// Two read-only opens share the file.
	b2, err := boltstore.Open(path, boltstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("second Open(ReadOnly) error: %v", err)
	}
	b2.Close()
	if err := b.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if after := fileSum(t, path); after != before {
		t.Errorf("file sha256 changed by a read-only open: %x, want %x", after, before)
	}
}

func TestBolt_Open_MissingOrEmptyWhereItMustExist(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts boltstore.Options
	}{
		{"ReadOnly", boltstore.Options{ReadOnly: true}},
		{"MustExist", boltstore.Options{MustExist: true}},
	} {
		t.Run(tc.name+"/missing", func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "data.db")
			b, err := boltstore.Open(path, tc.opts)
			if err == nil {
				b.Close()
			}
			if !errors.Is(err, store.ErrNoData) || !strings.Contains(err.Error(), path) {
				t.Errorf("Open(missing) = %v, want ErrNoData naming %s", err, path)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("Open(missing) left %d files", len(entries))
			}
		})
		t.Run(tc.name+"/empty", func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "data.db")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			b, err := boltstore.Open(path, tc.opts)
			if err == nil {
				b.Close()
			}
			if !errors.Is(err, store.ErrNoData) {
				t.Errorf("Open(0 bytes) = %v, want ErrNoData", err)
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
				t.Errorf("Open(0 bytes) changed the file: %v, %v", fi, err)
			}
		})
	}
}

// damage is one way a data file can be broken.
type damage struct {
	name string
	fn   func(t *testing.T, path string)
}

func truncateTo(t *testing.T, path string, size func(ps int64, hwm uint64, file int64) int64) {
	t.Helper()
	ps, hwm, err := boltstore.ReadMetaPage(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size(ps, hwm, fi.Size())); err != nil {
		t.Fatal(err)
	}
}

// flipMeta flips a byte inside the meta of page 0, and of page 1 too when
// both is set.
func flipMeta(t *testing.T, path string, both bool) {
	t.Helper()
	ps, _, err := boltstore.ReadMetaPage(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[16+40] ^= 0x01 // the high water mark
	if both {
		raw[ps+16+40] ^= 0x01
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

var openDamages = []damage{
	{"half", func(t *testing.T, path string) {
		truncateTo(t, path, func(ps int64, hwm uint64, file int64) int64 { return file / 2 / ps * ps })
	}},
	{"one page short", func(t *testing.T, path string) {
		truncateTo(t, path, func(ps int64, hwm uint64, file int64) int64 { return (int64(hwm) - 1) * ps })
	}},
	{"not a page multiple", func(t *testing.T, path string) {
		truncateTo(t, path, func(ps int64, hwm uint64, file int64) int64 { return file - 100 })
	}},
	{"one meta page", func(t *testing.T, path string) {
		truncateTo(t, path, func(ps int64, hwm uint64, file int64) int64 { return ps })
	}},
	{"100 bytes", func(t *testing.T, path string) {
		truncateTo(t, path, func(ps int64, hwm uint64, file int64) int64 { return 100 })
	}},
	{"both meta pages flipped", func(t *testing.T, path string) { flipMeta(t, path, true) }},
	{"garbage", func(t *testing.T, path string) {
		if err := os.WriteFile(path, bytes.Repeat([]byte{0xa5}, 64<<10), 0o600); err != nil {
			t.Fatal(err)
		}
	}},
}

func TestBolt_Open_DamagedFileIsErrCorrupt(t *testing.T) {
	for _, d := range openDamages {
		for _, ro := range []bool{false, true} {
			name := d.name
			if ro {
				name += "/read-only"
			}
			t.Run(name, func(t *testing.T) {
				path := buildFile(t)
				d.fn(t, path)
				before := fileSum(t, path)
				b, err := boltstore.Open(path, boltstore.Options{ReadOnly: ro})
				if err == nil {
					b.Close()
				}
				if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
					t.Errorf("Open = %v, want ErrCorrupt naming %s", err, path)
				}
				if after := fileSum(t, path); after != before {
					t.Errorf("a refused Open changed the file")
				}
			})
		}
	}
}

// TestBolt_Open_OneMetaPageFlippedFallsBack checks that a file whose
// newest meta page is torn opens on the other one, as after a crash during
// a commit: refusing it would make every such crash fatal.
func TestBolt_Open_OneMetaPageFlippedFallsBack(t *testing.T) {
	path := buildFile(t)
	flipMeta(t, path, false)
	b, err := boltstore.Open(path, boltstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("Open with one meta page damaged = %v, want it to open on the other", err)
	}
	defer b.Close()
	if err := b.Check(); err != nil {
		t.Errorf("Check() = %v", err)
	}
}

// damageBranchPages rewrites the first child pointer of every branch page
// of the file with child(id).
func damageBranchPages(t *testing.T, path string, child func(id uint64) uint64) {
	t.Helper()
	ps, hwm, err := boltstore.ReadMetaPage(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for id := int64(2); id < int64(hwm); id++ {
		p := raw[id*ps : (id+1)*ps]
		if binary.LittleEndian.Uint64(p) != uint64(id) || binary.LittleEndian.Uint16(p[8:]) != 0x01 {
			continue
		}
		// A branch element is pos, ksize, child pgid.
		binary.LittleEndian.PutUint64(p[16+8:], child(uint64(id)))
		n++
	}
	if n == 0 {
		t.Fatal("no branch page to damage")
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBolt_Open_DamagedPagesAreErrCorrupt damages branch pages in ways
// bbolt cannot survive when it walks the file (out of range pages, a
// page that is its own child, a page referenced twice): Open refuses the
// file, read-only or not, without crashing or hanging, whether bbolt
// would walk it (no persisted freelist) or only read the pages a
// transaction touches (a persisted one, where Open checks the structure
// above the leaves).
func TestBolt_Open_DamagedPagesAreErrCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		child func(id uint64) uint64
	}{
		{"child past the file", func(uint64) uint64 { return 1 << 40 }},
		{"child below the high water mark but a meta page", func(uint64) uint64 { return 1 }},
		{"own child", func(id uint64) uint64 { return id }},
	} {
		for _, mode := range []struct{ ro, persist bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
			t.Run(fmt.Sprintf("%s/read-only=%v/freelist=%v", tc.name, mode.ro, mode.persist), func(t *testing.T) {
				ro := mode.ro
				path := buildFileWith(t, boltstore.Options{PersistFreelist: mode.persist})
				damageBranchPages(t, path, tc.child)
				b, err := boltstore.Open(path, boltstore.Options{ReadOnly: ro})
				if err == nil {
					b.Close()
				}
				if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
					t.Errorf("Open = %v, want ErrCorrupt naming %s", err, path)
				}
			})
		}
	}
}

func TestBolt_Open_CreatesAndReopens(t *testing.T) {
	// A new file is created only without MustExist and ReadOnly; the
	// directory entry is fsync'd (not observable here), and the file
	// reopens with MustExist.
	path := filepath.Join(t.TempDir(), "data.db")
	b, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	b, err = boltstore.Open(path, boltstore.Options{MustExist: true})
	if err != nil {
		t.Fatalf("Open(MustExist) of a created file = %v", err)
	}
	b.Close()
}

// TestBolt_Open_SyncsTheDirectoryOfACreatedFile checks that a created
// file's directory entry is made durable (and that a failure to is an
// error), and that reopening an existing file does not sync again.
func TestBolt_Open_SyncsTheDirectoryOfACreatedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "data.db")
	var synced []string
	hooks := boltstore.TestHooks{SyncDir: func(d string) error {
		synced = append(synced, d)
		return nil
	}}
	b, err := boltstore.OpenWithHooks(path, boltstore.Options{}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if len(synced) != 1 || synced[0] != dir {
		t.Errorf("directories synced creating %s = %v, want [%s]", path, synced, dir)
	}
	b, err = boltstore.OpenWithHooks(path, boltstore.Options{}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if len(synced) != 1 {
		t.Errorf("reopening synced the directory again: %v", synced)
	}
	failing := boltstore.TestHooks{SyncDir: func(string) error { return errors.New("EIO") }}
	other := filepath.Join(t.TempDir(), "data.db")
	if b, err := boltstore.OpenWithHooks(other, boltstore.Options{}, failing); err == nil {
		b.Close()
		t.Errorf("Open with a failing directory sync succeeded")
	}
}
