package faultfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/participantd/participantd/store/vfs"
)

// OpKind is the kind of a counted operation.
type OpKind uint8

// The counted operations; see doc.go.
const (
	OpCreate OpKind = iota + 1
	OpOpenRW
	OpRemove
	OpMkdir
	OpSyncDir
	OpWrite
	OpSync
	OpPreallocate
	OpTruncate
	OpCommit
)

func (k OpKind) String() string {
	switch k {
	case OpCreate:
		return "create"
	case OpOpenRW:
		return "open-rw"
	case OpRemove:
		return "remove"
	case OpMkdir:
		return "mkdir"
	case OpSyncDir:
		return "sync-dir"
	case OpWrite:
		return "write"
	case OpSync:
		return "sync"
	case OpPreallocate:
		return "preallocate"
	case OpTruncate:
		return "truncate"
	case OpCommit:
		return "commit"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Op is one counted operation.
type Op struct {
	Index uint64
	Kind  OpKind
	Path  string
}

func (op Op) String() string { return fmt.Sprintf("#%d %v %s", op.Index, op.Kind, op.Path) }

// Action is what a Rule decides for an op.
type Action uint8

const (
	// None runs the op.
	None Action = iota
	// Fail returns an error wrapping ErrInjected and runs nothing.
	Fail
	// Cut cuts the power: this op and every later one fail with ErrCut.
	Cut
)

// Rule decides what happens to an op. It runs under the FS's lock and
// must not call the FS.
type Rule func(op Op) Action

// CutAt is the rule that cuts the power at op index i.
func CutAt(i uint64) Rule {
	return func(op Op) Action {
		if op.Index == i {
			return Cut
		}
		return None
	}
}

// Errors of the FS.
var (
	// ErrInjected is the error of an op a rule failed.
	ErrInjected = errors.New("faultfs: injected fault")
	// ErrCut is the error of every op at or after a power cut.
	ErrCut = errors.New("faultfs: power cut")
	// ErrStale is the error of a handle opened before a Crash.
	ErrStale = errors.New("faultfs: handle from before a crash")
	// ErrNoSpace is the error of a write, Preallocate or Truncate that
	// would take the files past the capacity; it wraps syscall.ENOSPC.
	ErrNoSpace = fmt.Errorf("faultfs: %w", syscall.ENOSPC)
	// ErrNotExist and ErrExist mirror the os errors.
	ErrNotExist = fmt.Errorf("faultfs: %w", iofs.ErrNotExist)
	ErrExist    = fmt.Errorf("faultfs: %w", iofs.ErrExist)
)

// OpError is the error of a failed op. It unwraps to ErrInjected or
// ErrCut.
type OpError struct {
	Op  Op
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("%v: %v", e.Op, e.Err) }

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// Model is how Crash treats what a file was written since its last Sync.
type Model uint8

const (
	// Strict picks, per file and per Crash, one of TornPrefix and Blocks.
	// It is the default.
	Strict Model = iota
	// TornPrefix loses every unsynced write but the last, which survives
	// up to a random byte.
	TornPrefix
	// Blocks keeps or loses each BlockSize block that changed since the
	// last Sync, independently, at its newest content: a disk that
	// writes a file's dirty sectors back in any order (the ALICE and
	// CrashMonkey model).
	Blocks
)

// BlockSize is the unit the Blocks model keeps or loses whole: a disk
// sector, the most a disk writes atomically.
const BlockSize = 512

// FS is the fault-injecting in-memory file system. The zero value is not
// usable; call New.
type FS struct {
	// mu guards every field below and every file's content.
	mu sync.Mutex
	// names is the current namespace; durable the one a Crash returns to,
	// before the directories it loses take their entries with them.
	names   map[string]*file
	durable map[string]*file
	// dirs are the current directories; durableDirs those whose entry in
	// their parent a SyncDir of the parent made durable.
	dirs        map[string]bool
	durableDirs map[string]bool
	ops         uint64
	rule        Rule
	cut         bool
	cutOp       Op
	epoch       uint64
	model       Model
	// capacity bounds the bytes of every file's content; 0 is no bound.
	capacity int64
}

// file is one file's content: data as the process sees it, synced as a
// Crash leaves it, and the last write since the last Sync, which a Crash
// may tear.
//
// An external file lives on the operating system's disk at its name,
// written there by another library (bbolt) inside Commit; synced is its
// content after the last Commit, and pending the content a Commit cut by
// the power left, which Crash tears.
type file struct {
	data      []byte
	synced    []byte
	lastWrite *torn
	external  bool
	pending   []byte
}

type torn struct {
	off  int64
	data []byte
}

// New returns an empty FS with the Strict model.
func New() *FS {
	return &FS{
		names:       map[string]*file{},
		durable:     map[string]*file{},
		dirs:        map[string]bool{"/": true, ".": true},
		durableDirs: map[string]bool{"/": true, ".": true},
	}
}

var _ vfs.FS = (*FS)(nil)
var _ vfs.Committer = (*FS)(nil)
var _ vfs.Spacer = (*FS)(nil)

// SetModel sets the model of every later Crash.
func (fs *FS) SetModel(m Model) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.model = m
}

// SetCapacity bounds the bytes all files together may hold (an external
// file counts at its size after its last Commit); 0 removes the bound. A
// WriteAt, Preallocate or Truncate that would pass it fails with
// ErrNoSpace and changes nothing, as a full disk refuses.
func (fs *FS) SetCapacity(n int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.capacity = n
}

// Available implements vfs.Spacer: the capacity left, or the most an
// int64 holds when there is no bound.
func (fs *FS) Available(string) (int64, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.capacity == 0 {
		return math.MaxInt64, nil
	}
	return max(fs.capacity-fs.usedLocked(), 0), nil
}

// usedLocked returns the bytes the files hold. fs.mu must be held.
func (fs *FS) usedLocked() int64 {
	var n int64
	for _, f := range fs.names {
		if f.external {
			n += int64(len(f.synced))
		} else {
			n += int64(len(f.data))
		}
	}
	return n
}

// growLocked fails with ErrNoSpace when f growing to size would pass the
// capacity. fs.mu must be held.
func (fs *FS) growLocked(f *file, kind OpKind, name string, size int64) error {
	if grow := size - int64(len(f.data)); fs.capacity > 0 && grow > 0 && fs.usedLocked()+grow > fs.capacity {
		return &OpError{Op: Op{Index: fs.ops - 1, Kind: kind, Path: name}, Err: ErrNoSpace}
	}
	return nil
}

// SetRule installs the rule consulted for every later op; nil means None
// for all.
func (fs *FS) SetRule(r Rule) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.rule = r
}

// Ops returns the number of ops counted so far.
func (fs *FS) Ops() uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.ops
}

// CutOp returns the op the power was cut at, if it was.
func (fs *FS) CutOp() (Op, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.cutOp, fs.cut
}

// admitLocked counts an op and returns the error it fails with, if any.
// fs.mu must be held.
func (fs *FS) admitLocked(kind OpKind, path string) error {
	op := Op{Index: fs.ops, Kind: kind, Path: path}
	fs.ops++
	if fs.cut {
		return &OpError{Op: op, Err: ErrCut}
	}
	if fs.rule == nil {
		return nil
	}
	switch fs.rule(op) {
	case Fail:
		return &OpError{Op: op, Err: ErrInjected}
	case Cut:
		fs.cut, fs.cutOp = true, op
		return &OpError{Op: op, Err: ErrCut}
	}
	return nil
}

// Crash simulates the restart after a power cut (whether or not a rule
// cut it): the namespace goes back to its last synced state, a directory
// whose entry was never synced into its parent is lost with everything
// in it, every file goes back to its synced content, and the cut is
// cleared, so that the same FS serves the restarted process. With rng
// non-nil, what was written since a file's last Sync survives in part, as
// the FS's Model says; with rng nil none of it does. An external file is
// rewritten on the operating system's disk as Crash leaves it, or
// removed if its entry is lost; an error doing so is returned.
func (fs *FS) Crash(rng *rand.Rand) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dirs := map[string]bool{}
	for d := range fs.durableDirs {
		if fs.survivesLocked(d) {
			dirs[d] = true
		}
	}
	names := make(map[string]*file, len(fs.durable))
	for name, f := range fs.durable {
		if !dirs[filepath.Dir(name)] {
			continue
		}
		var data []byte
		if f.external {
			data = crashExternal(f, rng)
		} else {
			data = crashFile(f, rng, fs.model)
		}
		names[name] = &file{data: data, synced: slices.Clone(data), external: f.external}
	}
	var errs []error
	for name, f := range fs.names {
		if f.external && names[name] == nil {
			if err := os.Remove(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	for name, f := range names {
		if f.external {
			if err := os.WriteFile(name, f.data, 0o600); err != nil {
				errs = append(errs, err)
			}
			f.data = nil
		}
	}
	fs.names, fs.durable = names, maps.Clone(names)
	fs.dirs, fs.durableDirs = dirs, maps.Clone(dirs)
	fs.cut, fs.rule = false, nil
	fs.epoch++
	return errors.Join(errs...)
}

// survivesLocked reports whether directory d and every directory above it
// are durable. fs.mu must be held.
func (fs *FS) survivesLocked(d string) bool {
	for {
		if !fs.durableDirs[d] {
			return false
		}
		parent := filepath.Dir(d)
		if parent == d {
			return true
		}
		d = parent
	}
}

// crashFile returns what a crash leaves of f under model m.
func crashFile(f *file, rng *rand.Rand, m Model) []byte {
	if rng == nil {
		return slices.Clone(f.synced)
	}
	if m == Strict {
		m = TornPrefix + Model(rng.IntN(2))
	}
	if m == Blocks {
		return keepBlocks(f.synced, f.data, rng)
	}
	data := slices.Clone(f.synced)
	if w := f.lastWrite; w != nil {
		n := rng.IntN(len(w.data) + 1)
		if end := w.off + int64(n); end > int64(len(data)) {
			data = append(data, make([]byte, end-int64(len(data)))...)
		}
		copy(data[w.off:], w.data[:n])
	}
	return data
}

// keepBlocks returns old with each BlockSize block in which cur differs
// from it replaced, at random, by cur's. The file keeps old's size unless
// a kept block of cur lies past it.
func keepBlocks(old, cur []byte, rng *rand.Rand) []byte {
	out := slices.Clone(old)
	span := func(b []byte, lo, hi int) []byte { return b[min(lo, len(b)):min(hi, len(b))] }
	for lo := 0; lo < max(len(old), len(cur)); lo += BlockSize {
		hi := lo + BlockSize
		if bytes.Equal(span(old, lo, hi), span(cur, lo, hi)) || rng.IntN(2) == 0 {
			continue
		}
		if end := min(hi, len(cur)); end > len(out) {
			out = append(out, make([]byte, end-len(out))...)
		}
		// A block cur has cut short reads as zeros past cur's end.
		clear(out[lo:min(hi, len(out))])
		copy(out[lo:], span(cur, lo, hi))
	}
	return out
}

// crashExternal returns what a crash leaves of an external file: its
// content after the last Commit, or, when the power was cut during one,
// that commit torn as a crash tears a bbolt commit: bbolt writes the data
// pages, syncs, writes the meta page, syncs. Pages 0 and 1 are its meta
// pages (page size 4096).
func crashExternal(f *file, rng *rand.Rand) []byte {
	if f.pending == nil || rng == nil {
		return slices.Clone(f.synced)
	}
	const metaEnd = 2 * 4096
	old, cur := f.synced, f.pending
	split := func(b []byte) ([]byte, []byte) {
		if len(b) <= metaEnd {
			return b, nil
		}
		return b[:metaEnd], b[metaEnd:]
	}
	oldMeta, oldData := split(old)
	curMeta, curData := split(cur)
	var meta, data []byte
	if rng.IntN(2) == 0 {
		// Cut before the first sync: the data pages in any state, the meta
		// pages as they were. bbolt grows a file (truncate, fsync) before
		// it writes pages there, so the size is the new one.
		meta, data = slices.Clone(oldMeta), keepBlocks(oldData, curData, rng)
		if len(data) < len(curData) {
			data = append(data, make([]byte, len(curData)-len(data))...)
		}
	} else {
		// Cut before the second: the data pages written, the meta page
		// torn, at a random byte or sector by sector.
		data = slices.Clone(curData)
		meta = crashFile(&file{synced: oldMeta, data: curMeta, lastWrite: metaWrite(oldMeta, curMeta)}, rng, Strict)
	}
	if len(meta) < metaEnd && len(data) > 0 {
		meta = append(meta, make([]byte, metaEnd-len(meta))...)
	}
	return append(meta, data...)
}

// metaWrite is the write that turned old into cur: the span of the bytes
// that differ.
func metaWrite(old, cur []byte) *torn {
	lo, hi := -1, 0
	for i := range cur {
		if i >= len(old) || old[i] != cur[i] {
			if lo < 0 {
				lo = i
			}
			hi = i + 1
		}
	}
	if lo < 0 {
		return nil
	}
	return &torn{off: int64(lo), data: slices.Clone(cur[lo:hi])}
}

// Commit implements vfs.Committer: it counts an OpCommit of path and runs
// write, which changes the operating system's file at path and makes the
// change durable. A rule's Fail or Cut there returns an error without
// running write, except that a Cut runs it first, so that Crash can tear
// the commit it interrupted. The file's directory entry becomes durable
// with a SyncDir of its directory, as a created file's does.
func (fs *FS) Commit(path string, write func() error) error {
	path = clean(path)
	fs.mu.Lock()
	err := fs.admitLocked(OpCommit, path)
	wasCut := fs.cut && fs.cutOp.Kind == OpCommit && fs.cutOp.Path == path && fs.cutOp.Index == fs.ops-1
	if err == nil && !fs.dirs[filepath.Dir(path)] {
		err = &OpError{Op: Op{Kind: OpCommit, Path: path}, Err: ErrNotExist}
	}
	fs.mu.Unlock()
	if err != nil && !wasCut {
		return err
	}
	// write runs without the lock: it is another library's I/O.
	werr := write()
	content, rerr := os.ReadFile(path)
	if errors.Is(rerr, iofs.ErrNotExist) {
		rerr = nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.names[path]
	if f == nil && (rerr != nil || content != nil) {
		f = &file{external: true}
		fs.names[path] = f
	}
	switch {
	case f == nil:
	case wasCut:
		f.pending = content
	case werr == nil && rerr == nil:
		f.synced = content
	}
	if werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	return rerr
}

func clean(name string) string { return filepath.Clean(name) }

// Create implements vfs.FS.
func (fs *FS) Create(name string) (vfs.File, error) {
	name = clean(name)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.admitLocked(OpCreate, name); err != nil {
		return nil, err
	}
	if !fs.dirs[filepath.Dir(name)] {
		return nil, &OpError{Op: Op{Kind: OpCreate, Path: name}, Err: ErrNotExist}
	}
	if fs.names[name] != nil {
		return nil, &OpError{Op: Op{Kind: OpCreate, Path: name}, Err: ErrExist}
	}
	f := &file{}
	fs.names[name] = f
	return &handle{fs: fs, f: f, name: name, epoch: fs.epoch, writable: true}, nil
}

// Open implements vfs.FS.
func (fs *FS) Open(name string) (vfs.File, error) {
	name = clean(name)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.names[name]
	if f == nil {
		return nil, &OpError{Op: Op{Path: name}, Err: ErrNotExist}
	}
	return &handle{fs: fs, f: f, name: name, epoch: fs.epoch}, nil
}

// OpenRW implements vfs.FS.
func (fs *FS) OpenRW(name string) (vfs.File, error) {
	name = clean(name)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.admitLocked(OpOpenRW, name); err != nil {
		return nil, err
	}
	f := fs.names[name]
	if f == nil {
		return nil, &OpError{Op: Op{Kind: OpOpenRW, Path: name}, Err: ErrNotExist}
	}
	return &handle{fs: fs, f: f, name: name, epoch: fs.epoch, writable: true}, nil
}

// Remove implements vfs.FS.
func (fs *FS) Remove(name string) error {
	name = clean(name)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.admitLocked(OpRemove, name); err != nil {
		return err
	}
	if fs.names[name] == nil {
		return &OpError{Op: Op{Kind: OpRemove, Path: name}, Err: ErrNotExist}
	}
	delete(fs.names, name)
	return nil
}

// List implements vfs.FS.
func (fs *FS) List(dir string) ([]string, error) {
	dir = clean(dir)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !fs.dirs[dir] {
		return nil, &OpError{Op: Op{Path: dir}, Err: ErrNotExist}
	}
	var out []string
	for name := range fs.names {
		if filepath.Dir(name) == dir {
			out = append(out, filepath.Base(name))
		}
	}
	slices.Sort(out)
	return out, nil
}

// MkdirAll implements vfs.FS. A new directory's entry is durable once a
// SyncDir of its parent covers it.
func (fs *FS) MkdirAll(dir string) error {
	dir = clean(dir)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.admitLocked(OpMkdir, dir); err != nil {
		return err
	}
	for d := dir; !fs.dirs[d]; d = filepath.Dir(d) {
		fs.dirs[d] = true
	}
	return nil
}

// SyncDir implements vfs.FS: the creates and removes in dir, of files
// and directories, become durable.
func (fs *FS) SyncDir(dir string) error {
	dir = clean(dir)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if err := fs.admitLocked(OpSyncDir, dir); err != nil {
		return err
	}
	if !fs.dirs[dir] {
		return &OpError{Op: Op{Kind: OpSyncDir, Path: dir}, Err: ErrNotExist}
	}
	for d := range fs.dirs {
		if filepath.Dir(d) == dir && d != dir {
			fs.durableDirs[d] = true
		}
	}
	for name := range fs.durable {
		if filepath.Dir(name) == dir && fs.names[name] == nil {
			delete(fs.durable, name)
		}
	}
	for name, f := range fs.names {
		if filepath.Dir(name) == dir {
			fs.durable[name] = f
		}
	}
	return nil
}

// handle is an open file.
type handle struct {
	fs       *FS
	f        *file
	name     string
	epoch    uint64
	writable bool
	closed   bool
}

func (h *handle) checkLocked(kind OpKind) error {
	if h.epoch != h.fs.epoch {
		return &OpError{Op: Op{Kind: kind, Path: h.name}, Err: ErrStale}
	}
	if h.closed {
		return &OpError{Op: Op{Kind: kind, Path: h.name}, Err: errors.New("faultfs: closed file")}
	}
	if kind != 0 && !h.writable {
		return &OpError{Op: Op{Kind: kind, Path: h.name}, Err: errors.New("faultfs: file opened read-only")}
	}
	return nil
}

func (h *handle) ReadAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(0); err != nil {
		return 0, err
	}
	if off >= int64(len(h.f.data)) {
		return 0, io.EOF
	}
	n := copy(p, h.f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *handle) WriteAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(OpWrite); err != nil {
		return 0, err
	}
	if err := h.fs.admitLocked(OpWrite, h.name); err != nil {
		return 0, err
	}
	if err := h.fs.growLocked(h.f, OpWrite, h.name, off+int64(len(p))); err != nil {
		return 0, err
	}
	if end := off + int64(len(p)); end > int64(len(h.f.data)) {
		h.f.data = append(h.f.data, make([]byte, end-int64(len(h.f.data)))...)
	}
	copy(h.f.data[off:], p)
	h.f.lastWrite = &torn{off: off, data: slices.Clone(p)}
	return len(p), nil
}

func (h *handle) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(OpSync); err != nil {
		return err
	}
	if err := h.fs.admitLocked(OpSync, h.name); err != nil {
		return err
	}
	h.f.synced = slices.Clone(h.f.data)
	h.f.lastWrite = nil
	return nil
}

func (h *handle) Preallocate(size int64) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(OpPreallocate); err != nil {
		return err
	}
	if err := h.fs.admitLocked(OpPreallocate, h.name); err != nil {
		return err
	}
	if err := h.fs.growLocked(h.f, OpPreallocate, h.name, size); err != nil {
		return err
	}
	if size > int64(len(h.f.data)) {
		h.f.data = append(h.f.data, make([]byte, size-int64(len(h.f.data)))...)
	}
	return nil
}

func (h *handle) Truncate(size int64) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(OpTruncate); err != nil {
		return err
	}
	if err := h.fs.admitLocked(OpTruncate, h.name); err != nil {
		return err
	}
	if err := h.fs.growLocked(h.f, OpTruncate, h.name, size); err != nil {
		return err
	}
	if size <= int64(len(h.f.data)) {
		h.f.data = h.f.data[:size:size]
	} else {
		h.f.data = append(h.f.data, make([]byte, size-int64(len(h.f.data)))...)
	}
	return nil
}

func (h *handle) Size() (int64, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(0); err != nil {
		return 0, err
	}
	return int64(len(h.f.data)), nil
}

func (h *handle) Close() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	h.closed = true
	return nil
}
