package faultfs

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
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
	// FailSync fails a sync the way Linux does (see doc.go, Failed
	// syncs): for an OpSync, the file's dirty pages are marked clean
	// without being written, so no later Sync writes them, while reads
	// still see them until a Crash; for an OpCommit, the change runs and
	// its pages are left so. The op returns an error wrapping
	// ErrInjected. For any other op it is Fail.
	FailSync
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
	// journaled makes a Crash keep a random prefix of the creates and
	// removes not yet synced (journal, in the order made).
	journaled bool
	journal   []nameChange
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
	// stale holds the pages (PageSize) a FailSync marked clean while
	// their content was not on disk: a Sync or Commit leaves the disk's
	// content there, until a write changes the page again. What the page
	// cache serves of them is data's (the operating system's file, for
	// an external one), which Crash drops.
	stale map[int64]struct{}
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
	_, err := fs.decideLocked(kind, path)
	return err
}

// decideLocked counts an op and returns the rule's action and the error
// the op fails with, if any. fs.mu must be held.
func (fs *FS) decideLocked(kind OpKind, path string) (Action, error) {
	op := Op{Index: fs.ops, Kind: kind, Path: path}
	fs.ops++
	if fs.cut {
		return Cut, &OpError{Op: op, Err: ErrCut}
	}
	if fs.rule == nil {
		return None, nil
	}
	switch a := fs.rule(op); a {
	case Fail, FailSync:
		return a, &OpError{Op: op, Err: ErrInjected}
	case Cut:
		fs.cut, fs.cutOp = true, op
		return Cut, &OpError{Op: op, Err: ErrCut}
	}
	return None, nil
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
	fs.journalLocked(name, f)
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
	fs.journalLocked(name, nil)
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
	fs.journal = slices.DeleteFunc(fs.journal, func(c nameChange) bool { return filepath.Dir(c.name) == dir })
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
	// A write dirties its pages again: the next Sync writes them whole,
	// with whatever else the page cache holds of them.
	for pg := off / PageSize; pg <= (off+int64(len(p))-1)/PageSize && len(p) > 0; pg++ {
		delete(h.f.stale, pg)
	}
	return len(p), nil
}

func (h *handle) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.checkLocked(OpSync); err != nil {
		return err
	}
	if act, err := h.fs.decideLocked(OpSync, h.name); err != nil {
		if act == FailSync {
			h.f.markStale(h.f.synced, h.f.data)
		}
		return err
	}
	h.f.synced = h.f.writeBack(h.f.data)
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
		for pg := range h.f.stale {
			if pg*PageSize >= size {
				delete(h.f.stale, pg)
			}
		}
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
