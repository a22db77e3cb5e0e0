package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"

	"github.com/participantd/participantd/store/vfs"
)

// DefaultSegmentSize is the size a segment is preallocated to when
// Options.SegmentSize is zero.
const DefaultSegmentSize = 64 << 20

// Options configures Open. The zero value means the defaults.
type Options struct {
	// SegmentSize is the size each new segment is preallocated to. A
	// record larger than a segment gets a segment of its own, as large as
	// it needs. Zero or negative means DefaultSegmentSize.
	SegmentSize int64
	// FS is the file system the log lives on; nil means vfs.OS.
	FS vfs.FS
}

func (o Options) fs() vfs.FS {
	if o.FS == nil {
		return vfs.OS
	}
	return o.FS
}

// ErrClosed reports a call on a closed Log.
var ErrClosed = errors.New("wal: closed")

// ErrDirSync reports a failed sync of the log's directory. It is sticky:
// on Linux the failure may have marked the directory's creates and
// removes clean without writing them, a later sync then succeeds without
// writing them, and a segment created before the failure could vanish in
// a power cut with the records acknowledged in it. So after one the Log
// refuses every Append and RemoveBelow (the error wraps ErrDirSync); a
// restart's Open changes the directory and syncs it, which writes it
// whole.
var ErrDirSync = errors.New("wal: directory sync failed")

// Info describes what a replay found.
type Info struct {
	// Segments is the number of segment files.
	Segments int
	// Records is the number of valid records with an LSN after the one
	// the replay started after (those given to apply).
	Records int
	// Last is the LSN of the last valid record, 0 when there is none.
	Last LSN
	// Torn is set when the last segment ends with an unfinished record
	// (or an unfinished header), which was never acknowledged; TornSegment
	// and TornOffset say where it starts. Open cuts it off; Replay leaves
	// it.
	Torn        bool
	TornSegment string
	TornOffset  int64
}

// Log is an open write-ahead log: its segments, and the last one open for
// appending. Append is called by one goroutine at a time; RemoveBelow and
// Segments may be called concurrently with it.
type Log struct {
	fs   vfs.FS
	dir  string
	opts Options

	// The fields below belong to the goroutine calling Append.
	f    vfs.File // the active segment
	off  int64    // where the next record goes in f
	size int64    // f's preallocated size
	next LSN      // the next record's LSN
	buf  []byte   // a record's body, then the record, reused between appends
	err  error    // sticky: the first failed write, sync or create

	// mu guards segs, which Append's rotation and RemoveBelow both change.
	mu sync.Mutex
	// segs are the segment files, in LSN order; the last is active.
	segs []segment

	// dirMu serialises the syncs of the log's directory, so that a sync
	// that failed has recorded its failure (dirErr) before any other sync
	// starts: a rotation whose create the failure may have marked clean
	// unwritten then fails rather than acknowledges a record in it. It is
	// held across the SyncDir call, and taken by nothing else.
	dirMu sync.Mutex
	// dirErr is the first failed directory sync (wrapping ErrDirSync),
	// set under dirMu and read by Append without it.
	dirErr atomic.Pointer[error]
}

// Replay calls apply, in LSN order, for every valid record of the log in
// dir whose LSN is after after, and changes nothing on disk. A torn last
// record is reported in Info, not given to apply; a corrupt log fails with
// a *CorruptionError. A missing dir is an empty log. The batches given to
// apply alias buffers that are never reused: apply may keep them.
func Replay(dir string, after LSN, opts Options, apply func(*Batch) error) (Info, error) {
	info, _, _, err := scan(opts.fs(), dir, after, apply, false)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, nil
	}
	return info, err
}

// HasSegments reports whether dir holds a segment file; a missing dir
// holds none.
func HasSegments(dir string, opts Options) (bool, error) {
	segs, err := listSegments(opts.fs(), dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return len(segs) > 0, err
}

// Open replays the log in dir as Replay does, creating dir if needed, then
// makes durable what it replayed and cuts off a torn tail, and starts a
// new segment for the records to come, whose LSNs follow both the log and
// after, the LSN the caller already holds (a checkpoint).
//
// Open trusts no byte it read to be on disk: after a failed fdatasync
// Linux marks the unwritten pages clean, the page cache keeps serving
// them to a restarted process, and a later fdatasync does not write them
// (PostgreSQL's "fsyncgate"). So every record it gives to apply is
// written again, over itself, and synced before Open returns (the last
// segment cut at its last valid record in the same sync): a record a
// caller replayed and built on can no longer vanish in a power cut. A
// last segment without a record (an unfinished creation, or one no
// record reached) is reused in place when the new segment would take its
// name, and otherwise removed once the new one is durable: wal/ never
// holds fewer segments than a crash needs.
func Open(dir string, after LSN, opts Options, apply func(*Batch) error) (*Log, Info, error) {
	fsys := opts.fs()
	// dir's entry must be durable in its parent before a record in it is
	// acknowledged: a crash that lost it would lose the log, and the next
	// Open would start after the checkpoint with no error.
	if err := vfs.MkdirAll(fsys, dir); err != nil {
		return nil, Info{}, fmt.Errorf("wal: create %s: %w", dir, err)
	}
	info, segs, scans, err := scan(fsys, dir, after, apply, true)
	if err != nil {
		return nil, info, err
	}
	var empty *segment
	for i, seg := range segs {
		sc := scans[i]
		isLast := i == len(segs)-1
		switch {
		case isLast && (!sc.headerOK || sc.records == 0):
			// A copy: the new segment's entry goes where this one's was.
			e := seg
			empty = &e
		case isLast:
			// The records replayed, written back by the scan; the tail
			// cut; one sync.
			err = finishRewrite(sc.f, join(dir, seg), sc.from, sc.end)
		case sc.end > sc.from:
			err = finishRewrite(sc.f, join(dir, seg), sc.from, -1)
		}
		if err != nil {
			break
		}
	}
	if cerr := closeScans(scans); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, info, err
	}
	l := &Log{fs: fsys, dir: dir, opts: opts, segs: segs, next: max(info.Last, after) + 1}
	if empty != nil {
		l.segs = segs[:len(segs)-1]
		if empty.first == l.next {
			// The new segment takes the empty one's name: recreating it in
			// place leaves the name in wal/ at every instant.
			if err := l.reuse(*empty); err != nil {
				return nil, info, err
			}
			return l, info, nil
		}
	}
	if err := l.rotate(0); err != nil {
		return nil, info, err
	}
	if empty != nil {
		// The new segment is durable; the empty one holds nothing.
		if err := fsys.Remove(join(dir, *empty)); err != nil {
			l.Close()
			return nil, info, fmt.Errorf("wal: remove the empty segment %s: %w", empty.name, err)
		}
		if err := l.syncDir(); err != nil {
			l.Close()
			return nil, info, fmt.Errorf("wal: remove the empty segment %s: %w", empty.name, err)
		}
	}
	return l, info, nil
}

// finishRewrite cuts f, the segment at path whose records from off the
// scan wrote over themselves, at size when size >= 0, and syncs it: a
// page a failed sync marked clean is dirtied again and really written.
func finishRewrite(f vfs.File, path string, off, size int64) error {
	var err error
	if size >= 0 {
		err = f.Truncate(size)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("wal: rewrite the tail of %s from %d: %w", path, off, err)
	}
	return nil
}

// closeScans closes the segments the scan left open for writing.
func closeScans(scans []segmentScan) error {
	var err error
	for _, sc := range scans {
		if sc.f == nil {
			continue
		}
		if cerr := sc.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("wal: close: %w", cerr)
		}
	}
	return err
}

// scan reads every segment of dir in order, checking headers and the LSN
// chain, and calls apply for the records after after. It returns the
// segments and what scanning each found.
//
// A segment that is not the last and whose successor starts at or below
// after+1 holds only records at or below after, which the caller holds
// already: it is covered, and damage in it (a torn tail the page cache
// hid when the segment was removed, a removal a crash undid) loses
// nothing, so it is skipped rather than refused. Only a segment of an
// unknown format is refused wherever it is.
//
// With rewrite (Open), each segment that is not covered is opened for
// writing, its records after after are written over themselves as they
// are read and applied, and it is left open in its segmentScan; on an
// error every one is closed.
func scan(fsys vfs.FS, dir string, after LSN, apply func(*Batch) error, rewrite bool) (info Info, segs []segment, scans []segmentScan, err error) {
	segs, err = listSegments(fsys, dir)
	if err != nil {
		return info, nil, nil, err
	}
	info.Segments = len(segs)
	found := make([]segmentScan, len(segs))
	defer func() {
		if err != nil {
			closeScans(found)
		}
	}()
	var expect LSN
	for i, seg := range segs {
		isLast := i == len(segs)-1
		covered := !isLast && segs[i+1].first <= after+1
		// Records at or below after are already held by the caller, so a
		// segment may start anywhere up to after+1; past it, LSNs must
		// follow on without a gap.
		if i == 0 || seg.first <= after+1 {
			if seg.first > after+1 {
				return info, nil, nil, corrupt(seg, 0, fmt.Sprintf("LSN gap: the log starts at %v, after the checkpoint at %v", seg.first, after))
			}
			expect = seg.first
		}
		r, f, err := openSegment(fsys, join(dir, seg), seg.name, rewrite && !covered)
		if err != nil {
			return info, nil, nil, err
		}
		if rewrite && !covered {
			found[i].f = f
		}
		if covered {
			sc, err := scanSegment(seg, r, expect, after, func(*Batch) error { return nil })
			f.Close()
			if errors.Is(err, ErrUnknownVersion) || (err != nil && !errors.Is(err, ErrCorrupt)) {
				// A failed read is not damage a covered segment may hold.
				return info, nil, nil, err
			}
			if err == nil && sc.headerOK && sc.records > 0 {
				info.Last = sc.last
			}
			found[i] = segmentScan{from: sc.end, end: sc.end}
			continue
		}
		sc, err := scanSegment(seg, r, expect, after, func(b *Batch) error {
			info.Records++
			return apply(b)
		})
		if found[i].f == nil {
			f.Close()
		}
		sc.f = found[i].f
		found[i] = sc
		if err != nil {
			return info, nil, nil, err
		}
		switch {
		case !sc.headerOK && !isLast:
			return info, nil, nil, corrupt(seg, 0, "bad segment header")
		case sc.torn && !isLast:
			return info, nil, nil, corrupt(seg, sc.end, "bad record at the end of a segment that is not the last")
		case !sc.headerOK || sc.torn:
			info.Torn, info.TornSegment, info.TornOffset = true, seg.name, sc.end
		}
		if sc.records > 0 {
			info.Last = sc.last
			expect = sc.last + 1
		}
	}
	return info, segs, found, nil
}

// rotate starts a new active segment big enough for a record of n bytes,
// and makes it and its directory entry durable before any record goes in.
func (l *Log) rotate(n int) error {
	seg := segment{name: segmentName(l.next), first: l.next}
	path := join(l.dir, seg)
	f, err := l.fs.Create(path)
	if err != nil {
		return fmt.Errorf("wal: create %s: %w", path, err)
	}
	return l.start(f, seg, n, path)
}

// reuse makes seg, a last segment without a record and named after the
// next LSN, the active segment, cleared and prepared as rotate prepares a
// new one. Its entry may be one a failed directory sync left unwritten
// (the rotation that created it failed there, and a restart without a
// reboot finds it in the page cache), which a later sync does not write
// until the directory changes: so the directory is changed (vfs.Dirty)
// before the sync of start, which then writes it whole.
func (l *Log) reuse(seg segment) error {
	path := join(l.dir, seg)
	f, err := l.fs.OpenRW(path)
	if err != nil {
		return fmt.Errorf("wal: reuse %s: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return fmt.Errorf("wal: reuse %s: %w", path, err)
	}
	if err := vfs.Dirty(l.fs, l.dir); err != nil {
		f.Close()
		return fmt.Errorf("wal: reuse %s: %w", path, err)
	}
	return l.start(f, seg, 0, path)
}

// start writes the header of seg, open as f at path, preallocates it for
// a record of n bytes, syncs it and its directory, and makes it the
// active segment; on an error it closes f.
func (l *Log) start(f vfs.File, seg segment, n int, path string) error {
	size := l.opts.SegmentSize
	if size <= 0 {
		size = DefaultSegmentSize
	}
	size = max(size, int64(segmentHeaderLen+n))
	_, err := f.WriteAt(segmentHeader(seg.first), 0)
	if err == nil {
		if err = f.Preallocate(size); err == nil {
			err = f.Sync()
		}
	}
	if err == nil {
		// The segment must be in its directory durably before a record in
		// it is acknowledged.
		err = l.syncDir()
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("wal: create %s: %w", path, err)
	}
	if l.f != nil {
		// Every record of the old segment was synced when it was written.
		l.f.Close()
	}
	l.f, l.off, l.size = f, segmentHeaderLen, size
	l.mu.Lock()
	l.segs = append(l.segs, seg)
	l.mu.Unlock()
	return nil
}

// grow extends the empty active segment for a record of n bytes.
func (l *Log) grow(n int) error {
	size := int64(segmentHeaderLen + n)
	if err := l.f.Preallocate(size); err != nil {
		return fmt.Errorf("wal: grow %s: %w", l.activeName(), err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("wal: grow %s: %w", l.activeName(), err)
	}
	l.size = size
	return nil
}

// Append writes b as the next record, setting b.LSN, with one write and
// one fdatasync, and returns nil only once the record is durable. A failed
// write, sync or segment creation is sticky: every later Append returns
// it, since the file's contents are then unknown. Append does not keep b.
func (l *Log) Append(b *Batch) (LSN, error) {
	if l.err == nil {
		if p := l.dirErr.Load(); p != nil {
			l.err = *p
		}
	}
	if l.err != nil {
		return 0, l.err
	}
	if l.f == nil {
		return 0, ErrClosed
	}
	b.LSN = l.next
	// The body is encoded into the record's buffer and framed there.
	body, err := appendBody(l.buf[:0], b)
	if err != nil {
		return 0, err // nothing was written: not sticky
	}
	if l.off+framedLen(l.off, len(body)) > l.size {
		grow := l.rotate
		if l.off == segmentHeaderLen {
			// The active segment is empty and named after this record's
			// LSN: it grows rather than gets a successor of the same name.
			grow = l.grow
		}
		if err := grow(int(framedLen(segmentHeaderLen, len(body)))); err != nil {
			l.err = err
			return 0, err
		}
	}
	frame := frameInPlace(body, l.off, b.LSN)
	if _, err := l.f.WriteAt(frame, l.off); err != nil {
		l.err = fmt.Errorf("wal: write %s: %w", l.activeName(), err)
		return 0, l.err
	}
	if err := l.f.Sync(); err != nil {
		l.err = fmt.Errorf("wal: sync %s: %w", l.activeName(), err)
		return 0, l.err
	}
	l.off += int64(len(frame))
	l.next++
	l.buf = keepBuffer(frame)
	return b.LSN, nil
}

// keepBuffer returns b emptied for the next append, or nil when it is
// larger than maxKeptBuffer.
func keepBuffer(b []byte) []byte {
	if cap(b) > maxKeptBuffer {
		return nil
	}
	return b[:0]
}

// maxKeptBuffer bounds the encoding buffer kept between appends.
const maxKeptBuffer = 4 << 20

func (l *Log) activeName() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.segs[len(l.segs)-1].name
}

// Next returns the LSN the next Append will assign.
func (l *Log) Next() LSN { return l.next }

// RemoveBelow deletes every segment whose records all have LSNs at or
// below lsn, never the active one, and syncs the directory after: a
// removed segment does not come back after a crash (one that did would
// hold only records replay skips, and is skipped whatever its state).
// The caller's checkpoint at lsn must be durable first.
//
// A failed removal leaves the segments after it in place, for a later
// call; a failed sync of the directory fails the log (ErrDirSync, sticky:
// every later Append and RemoveBelow returns it).
func (l *Log) RemoveBelow(lsn LSN) error {
	if p := l.dirErr.Load(); p != nil {
		return *p
	}
	l.mu.Lock()
	var doomed []segment
	for len(l.segs) > 1 && l.segs[1].first <= lsn+1 {
		doomed = append(doomed, l.segs[0])
		l.segs = l.segs[1:]
	}
	l.mu.Unlock()
	if len(doomed) == 0 {
		return nil
	}
	for _, seg := range doomed {
		if err := l.fs.Remove(join(l.dir, seg)); err != nil {
			return fmt.Errorf("wal: remove %s: %w", seg.name, err)
		}
	}
	if err := l.syncDir(); err != nil {
		return fmt.Errorf("wal: remove segments: %w", err)
	}
	return nil
}

// syncDir syncs the log's directory, unless a sync of it failed before,
// and records a failure (dirErr) before any other sync of it starts.
func (l *Log) syncDir() error {
	l.dirMu.Lock()
	defer l.dirMu.Unlock()
	if p := l.dirErr.Load(); p != nil {
		return *p
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		err = fmt.Errorf("%w: %s: %w", ErrDirSync, l.dir, err)
		l.dirErr.Store(&err)
		return err
	}
	return nil
}

// Segments returns the number of segment files.
func (l *Log) Segments() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.segs)
}

// Dir returns the log's directory.
func (l *Log) Dir() string { return l.dir }

// Close closes the active segment. Every appended record is already
// durable. Calls after Close return ErrClosed.
func (l *Log) Close() error {
	if l.f == nil {
		return ErrClosed
	}
	err := l.f.Close()
	l.f = nil
	if err != nil {
		return fmt.Errorf("wal: close: %w", err)
	}
	return nil
}
