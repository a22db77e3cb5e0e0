package wal

import (
	"bytes"

	"github.com/participantd/participantd/store/vfs"
)

func osFS() vfs.FS { return vfs.OS }

// bufReader reads buf as a segment through a window of chunk bytes.
func bufReader(buf []byte, chunk int64) *segmentReader {
	return newSegmentReader(bytes.NewReader(buf), "test", int64(len(buf)), chunk)
}
