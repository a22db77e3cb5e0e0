package wal

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"

	"github.com/participantd/participantd/store/vfs"
)

func osFS() vfs.FS { return vfs.OS }

// bufReader reads buf as a segment through a window of chunk bytes.
func bufReader(buf []byte, chunk int64) *segmentReader {
	return newSegmentReader(bytes.NewReader(buf), "test", int64(len(buf)), chunk)
}

// segmentRecords returns the offsets at which the valid records of raw,
// a segment of either format, start, then the end of the last.
func segmentRecords(raw []byte) []int64 {
	offs := []int64{segmentHeaderLen}
	if len(raw) < segmentHeaderLen {
		return offs
	}
	if raw[7] == segmentFormat1 {
		for {
			_, end, err := readFrame(raw, offs[len(offs)-1])
			if err != nil {
				return offs
			}
			offs = append(offs, end)
		}
	}
	r := bufReader(raw, readChunk)
	lsn := LSN(binary.LittleEndian.Uint64(raw[8:]))
	for {
		_, end, ok, err := r.record2(offs[len(offs)-1], lsn)
		if err != nil || !ok {
			return offs
		}
		offs = append(offs, end)
		lsn++
	}
}

// toFormat1 rewrites every segment of the log in dir as segment format 1
// frames it, each record at the offset it gets there, zeros after up to
// the segment's size: the log an earlier binary would have written.
func toFormat1(t testing.TB, dir string) {
	t.Helper()
	segs, err := listSegments(osFS(), dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range segs {
		path := join(dir, seg)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		out := formatHeader(seg.first, segmentFormat1)
		r := bufReader(raw, readChunk)
		offs := segmentRecords(raw)
		for i := 0; i+1 < len(offs); i++ {
			body, _, ok, err := r.record2(offs[i], seg.first+LSN(i))
			if err != nil || !ok {
				t.Fatalf("%s: record at %d: %v", seg.name, offs[i], err)
			}
			b, err := decodeBody(body)
			if err != nil {
				t.Fatal(err)
			}
			if out, err = appendFrame(out, b); err != nil {
				t.Fatal(err)
			}
		}
		if len(out) < len(raw) {
			out = append(out, make([]byte, len(raw)-len(out))...)
		}
		if err := os.WriteFile(path, out, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
