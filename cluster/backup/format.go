package backup

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/cluster"
)

// Magic starts every cluster backup file.
const Magic = "PDCLBAK\n"

// FormatVersion is the version of the file format this package writes and
// reads.
const FormatVersion = 1

// MaxFrameBytes bounds one frame's body: an etcd request is at most a few
// MiB, so one key and its value are well below it.
const MaxFrameBytes = 16 << 20

const (
	frameHeader  = 'H'
	frameEntry   = 'E'
	frameTrailer = 'T'
)

// Sentinel errors.
var (
	// ErrNotBackup reports a file that does not start with Magic (a
	// single-node backup is a bbolt file, restored with --data).
	ErrNotBackup = errors.New("backup: not a participantd cluster backup")
	// ErrVersion reports a format version this build does not read.
	ErrVersion = errors.New("backup: unsupported format version")
	// ErrCorrupt reports a damaged or cut file: bad framing, keys out of
	// order, a count or checksum that does not match.
	ErrCorrupt = errors.New("backup: corrupt backup")
	// ErrCompacted reports an export whose revision etcd compacted away
	// while it read: the backup is incomplete and must be taken again.
	ErrCompacted = errors.New("backup: the backup's revision was compacted during the read")
	// ErrNotEmpty reports a restore into a prefix that holds keys.
	ErrNotEmpty = errors.New("backup: the target prefix is not empty")
	// ErrNodeKeyDiffers reports a restore into a prefix that holds a node
	// key (NodeKeyKey) other than the backup's, without
	// RestoreOptions.ReplaceNodeKey.
	ErrNodeKeyDiffers = errors.New("backup: the target prefix holds another node key")
)

// NodeKeyKey is the cluster secret's key, relative to the prefix.
const NodeKeyKey = cluster.NodeKeyName

// Header is the first frame of a backup.
type Header struct {
	// Format is FormatVersion.
	Format int `msgpack:"format" json:"format"`
	// Prefix is the etcd prefix the backup was taken under; entry keys are
	// relative to it.
	Prefix string `msgpack:"prefix" json:"prefix"`
	// Revision is the etcd revision every key was read at.
	Revision int64 `msgpack:"revision" json:"revision"`
	// Keys is the number of entries.
	Keys int64 `msgpack:"keys" json:"keys"`
	// Created is when the backup began, Unix nanoseconds.
	Created int64 `msgpack:"created" json:"created"`
}

// Trailer is the last frame of a backup.
type Trailer struct {
	Keys   int64  `msgpack:"keys"`
	SHA256 []byte `msgpack:"sha256"`
}

// Entry is one key of a backup.
type Entry struct {
	// Key is relative to Header.Prefix.
	Key   []byte
	Value []byte
}

// Writer writes a backup: NewWriter writes the header, Add each entry in
// ascending key order, Close the trailer. It does not close the
// underlying writer.
type Writer struct {
	w    io.Writer
	sum  hash.Hash
	hdr  Header
	keys int64
	last []byte
	buf  bytes.Buffer
	err  error
}

// NewWriter writes the magic and h to w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	h.Format = FormatVersion
	bw := &Writer{w: w, sum: sha256.New(), hdr: h}
	if err := bw.raw([]byte(Magic)); err != nil {
		return nil, err
	}
	if err := bw.frame(frameHeader, h); err != nil {
		return nil, err
	}
	return bw, nil
}

func (w *Writer) raw(b []byte) error {
	if w.err != nil {
		return w.err
	}
	w.sum.Write(b)
	if _, err := w.w.Write(b); err != nil {
		w.err = err
	}
	return w.err
}

func (w *Writer) frame(typ byte, v any) error {
	w.buf.Reset()
	w.buf.Write([]byte{typ, 0, 0, 0, 0})
	if err := msgpack.NewEncoder(&w.buf).Encode(v); err != nil {
		return err
	}
	b := w.buf.Bytes()
	if len(b)-5 > MaxFrameBytes {
		return fmt.Errorf("backup: a frame of %d bytes passes the %d-byte limit", len(b)-5, MaxFrameBytes)
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	return w.raw(b)
}

// Add writes one entry. Keys must ascend strictly.
func (w *Writer) Add(key, value []byte) error {
	if w.keys > 0 && bytes.Compare(key, w.last) <= 0 {
		return fmt.Errorf("backup: key %q after %q: keys must ascend", key, w.last)
	}
	if err := w.frame(frameEntry, [][]byte{key, value}); err != nil {
		return err
	}
	w.keys++
	w.last = append(w.last[:0], key...)
	return nil
}

// Close writes the trailer. It fails when the number of entries is not the
// header's.
func (w *Writer) Close() error {
	if w.keys != w.hdr.Keys {
		return fmt.Errorf("backup: wrote %d keys, the header announced %d", w.keys, w.hdr.Keys)
	}
	if w.err != nil {
		return w.err
	}
	t := Trailer{Keys: w.keys, SHA256: w.sum.Sum(nil)}
	return w.frame(frameTrailer, t)
}

// Reader reads a backup frame by frame. Next returns io.EOF only after the
// trailer matched (count and checksum) and nothing follows it: until then
// an entry may still belong to a damaged file.
type Reader struct {
	r    *bufio.Reader
	sum  hash.Hash
	hdr  Header
	keys int64
	last []byte
	buf  []byte
	done bool
}

// NewReader reads the magic and the header of r.
func NewReader(r io.Reader) (*Reader, error) {
	br := &Reader{r: bufio.NewReaderSize(r, 64<<10), sum: sha256.New()}
	magic := make([]byte, len(Magic))
	if _, err := io.ReadFull(br.r, magic); err != nil || string(magic) != Magic {
		return nil, ErrNotBackup
	}
	br.sum.Write(magic)
	typ, body, err := br.frame()
	if err != nil {
		return nil, err
	}
	if typ != frameHeader {
		return nil, fmt.Errorf("%w: the first frame is not a header", ErrCorrupt)
	}
	var h Header
	if err := msgpack.Unmarshal(body, &h); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if h.Format != FormatVersion {
		return nil, fmt.Errorf("%w %d (this build reads %d)", ErrVersion, h.Format, FormatVersion)
	}
	if h.Keys < 0 || h.Revision <= 0 {
		return nil, fmt.Errorf("%w: header: %d keys at revision %d", ErrCorrupt, h.Keys, h.Revision)
	}
	br.hdr = h
	return br, nil
}

// Header returns the backup's header.
func (r *Reader) Header() Header { return r.hdr }

// frame reads one frame; the body is valid until the next call. Its bytes
// are not yet hashed (the trailer's are never).
func (r *Reader) frame() (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r.r, head[:]); err != nil {
		return 0, nil, fmt.Errorf("%w: cut after %d entries: %v", ErrCorrupt, r.keys, err)
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > MaxFrameBytes {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes", ErrCorrupt, n)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	body := r.buf[:n]
	if _, err := io.ReadFull(r.r, body); err != nil {
		return 0, nil, fmt.Errorf("%w: cut after %d entries: %v", ErrCorrupt, r.keys, err)
	}
	if head[0] != frameTrailer {
		r.sum.Write(head[:])
		r.sum.Write(body)
	}
	return head[0], body, nil
}

// Next returns the next entry (its slices are the caller's), or io.EOF
// once the trailer verified the whole file.
func (r *Reader) Next() (Entry, error) {
	if r.done {
		return Entry{}, io.EOF
	}
	typ, body, err := r.frame()
	if err != nil {
		return Entry{}, err
	}
	switch typ {
	case frameEntry:
		var kv [][]byte
		if err := msgpack.Unmarshal(body, &kv); err != nil || len(kv) != 2 {
			return Entry{}, fmt.Errorf("%w: entry %d unreadable", ErrCorrupt, r.keys)
		}
		if r.keys > 0 && bytes.Compare(kv[0], r.last) <= 0 {
			return Entry{}, fmt.Errorf("%w: key %q out of order", ErrCorrupt, kv[0])
		}
		r.keys++
		if r.keys > r.hdr.Keys {
			return Entry{}, fmt.Errorf("%w: more than the %d keys the header announced", ErrCorrupt, r.hdr.Keys)
		}
		r.last = append(r.last[:0], kv[0]...)
		return Entry{Key: kv[0], Value: kv[1]}, nil
	case frameTrailer:
		var t Trailer
		if err := msgpack.Unmarshal(body, &t); err != nil {
			return Entry{}, fmt.Errorf("%w: trailer unreadable", ErrCorrupt)
		}
		if t.Keys != r.keys || r.keys != r.hdr.Keys {
			return Entry{}, fmt.Errorf("%w: %d entries read, the header says %d and the trailer %d", ErrCorrupt, r.keys, r.hdr.Keys, t.Keys)
		}
		if !bytes.Equal(t.SHA256, r.sum.Sum(nil)) {
			return Entry{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
		}
		if _, err := r.r.ReadByte(); err != io.EOF {
			return Entry{}, fmt.Errorf("%w: bytes after the trailer", ErrCorrupt)
		}
		r.done = true
		return Entry{}, io.EOF
	default:
		return Entry{}, fmt.Errorf("%w: unknown frame type %q", ErrCorrupt, typ)
	}
}

// Check reads the whole backup r and returns its header when it is intact:
// framing, order, count and checksum, and, for a backup of a cluster of
// checksummed values (one holding cluster.FormatKey), every value's own
// checksum (cluster.UnsealRel): a damaged value is ErrCorrupt wrapping its
// *store.ChecksumError. A backup of a cluster before checksums (no format
// key) carries none; it restores as such, to be converted
// (cluster.Convert).
func Check(r io.Reader) (Header, error) {
	h, _, err := check(r)
	return h, err
}

// check is Check, and also returns the node key (NodeKeyKey) the backup
// holds, nil if none.
func check(r io.Reader) (Header, []byte, error) {
	br, err := NewReader(r)
	if err != nil {
		return Header{}, nil, err
	}
	var (
		nodeKey []byte
		format  []byte
		// damaged is the first value that does not verify, and bad how
		// many; they count only once the format key says values are
		// sealed, which is known at the end (keys come in key order).
		damaged error
		bad     int
	)
	for {
		e, err := br.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Header{}, nil, err
		}
		if string(e.Key) == NodeKeyKey {
			nodeKey = bytes.Clone(e.Value)
		}
		if string(e.Key) == cluster.FormatKey {
			format = bytes.Clone(e.Value)
		}
		if _, err := cluster.UnsealRel(string(e.Key), e.Value); err != nil {
			if damaged == nil {
				damaged = err
			}
			bad++
		}
	}
	if format == nil {
		return br.Header(), nodeKey, nil
	}
	if err := cluster.ParseFormat(format); err != nil {
		return Header{}, nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if damaged != nil {
		return Header{}, nil, fmt.Errorf("%w: %d values fail their checksums, the first: %w", ErrCorrupt, bad, damaged)
	}
	return br.Header(), nodeKey, nil
}
