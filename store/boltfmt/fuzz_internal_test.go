package boltfmt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/participantd/participantd/store"
)

// FuzzDecodeEntryKey checks the streams bucket's key decoder: it never
// panics, and every key it accepts is the encoding of what it returns.
func FuzzDecodeEntryKey(f *testing.F) {
	for _, k := range [][]byte{
		entryKey("oplog/1", 0),
		entryKey("outbox/18446744073709551615", 1<<63),
		entryKey("conversations", 7),
		entryKey(string(bytes.Repeat([]byte{'x'}, store.MaxNameLen)), 1),
		{0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		{0xff, 0xff, 'a'},
		{},
	} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, k []byte) {
		stream, seq, err := decodeEntryKey(k)
		if err != nil {
			return
		}
		if stream == "" || len(stream) > store.MaxNameLen {
			t.Fatalf("decodeEntryKey(%x) accepted stream name of %d bytes", k, len(stream))
		}
		if again := entryKey(stream, seq); !bytes.Equal(again, k) {
			t.Fatalf("decodeEntryKey(%x) = %q, %d; which encodes as %x", k, stream, seq, again)
		}
	})
}

// FuzzParseMeta checks the meta page parser on any bytes: it never panics,
// and what it accepts has the bounds Open relies on.
func FuzzParseMeta(f *testing.F) {
	path := filepath.Join(f.TempDir(), "seed.db")
	writeStore(f, path, false, 0, 1, nil, false)
	raw, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw[:metaEnd])
	f.Add(raw[4096 : 4096+metaEnd])
	f.Add(make([]byte, metaEnd))
	f.Fuzz(func(t *testing.T, page []byte) {
		m, err := parseMeta(page)
		if err != nil {
			return
		}
		if m.pageSize < minPageSize || m.pageSize > maxPageSize || m.hwm < 2 || m.root >= m.hwm {
			t.Fatalf("parseMeta accepted %+v", m)
		}
	})
}

// FuzzCheckFile writes any bytes as a data file: checkFile never panics
// nor reads past the file, and reports damage as store.ErrCorrupt.
func FuzzCheckFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "seed.db")
	writeStore(f, path, false, 50, 50, bytes.Repeat([]byte{'v'}, 300), false)
	raw, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(raw)
	f.Add(raw[:len(raw)/2])
	f.Add(raw[:4096*2])
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "data.db")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		state, _, err := checkFile(p)
		switch {
		case err != nil && !errors.Is(err, store.ErrCorrupt):
			t.Fatalf("checkFile error %v does not wrap store.ErrCorrupt", err)
		case err == nil && len(data) == 0 && state != fileEmpty:
			t.Fatalf("checkFile(0 bytes) = %v", state)
		case err == nil && len(data) > 0 && state != fileValid:
			t.Fatalf("checkFile(%d bytes) = %v, nil", len(data), state)
		}
	})
}
