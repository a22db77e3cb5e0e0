package participant_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/faultfs"
	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

var powerCutLong = flag.Bool("long", false, "TestPowerCut cuts at every file-system call of the workload, several times over, instead of a sample")

// powerCutOptions keep segments and checkpoints small, so that the
// workload rotates segments, checkpoints and removes segments while it
// runs, and every one of those calls is a cut point.
func powerCutOptions(ffs *faultfs.FS) logfirst.Options {
	return logfirst.Options{FS: ffs, SegmentSize: 2 << 10, CheckpointBytes: 1 << 10, CheckpointInterval: time.Millisecond}
}

// powerCutRunOf runs workload on a log-first store whose log lives on
// ffs, in dir, and returns what it answered.
func powerCutRunOf(t *testing.T, ffs *faultfs.FS, dir string, workload func(store.DurableStore, *[]participanttest.Answered) error) []participanttest.Answered {
	t.Helper()
	return faultedRunOf(t, ffs, dir, workload, func() bool { _, cut := ffs.CutOp(); return cut })
}

// faultedRunOf is powerCutRunOf where faulted reports whether a fault was
// injected, which alone may fail the start or the workload.
func faultedRunOf(t *testing.T, ffs *faultfs.FS, dir string, workload func(store.DurableStore, *[]participanttest.Answered) error, faulted func() bool) []participanttest.Answered {
	t.Helper()
	st, err := logfirst.Open(dir, powerCutOptions(ffs))
	if faulted() && err != nil {
		return nil // the fault hit the first start
	}
	if err != nil {
		t.Fatalf("Open before the fault: %v", err)
	}
	var log []participanttest.Answered
	werr := workload(faultstore.New(st), &log)
	if !faulted() && werr != nil {
		t.Fatalf("workload without a fault: %v", werr)
	}
	// Close stops the store; after a cut the store has failed and only
	// releases its files. Either way the crash below decides what is left.
	if err := st.Close(); err != nil && !errors.Is(err, store.ErrFailed) {
		t.Fatalf("Close: %v", err)
	}
	return log
}

// powerCutLoop is the power-cut loop the TestPowerCut tests share: a
// clean run of workload counts its file-system calls and must leave what
// completed checks; then the power is cut at every one of those calls (and
// a few past them, where the cut leaves the run complete), over and over
// until runs cuts are made (ten times as many with -long): the
// checkpointer's timing and the torn length differ between visits. After
// each cut, faultfs's strict model decides what survives, the offline
// tools run on the directory (compact with compact's options), and a start
// must satisfy participanttest's invariants, and completed when the cut
// left the run complete.
type powerCutLoop struct {
	workload  func(store.DurableStore, *[]participanttest.Answered) error
	completed func(faultstore.TB, store.DurableStore)
	compact   participant.Options
	runs      int
	// stream separates this loop's crash randomness from the others'.
	stream uint64
	// gaps, when set, counts the cuts that left a conversation with rows
	// for reconciliation to repair (Inspect before the start).
	gaps *int
}

func (p powerCutLoop) run(t *testing.T) {
	t.Helper()
	ffs := faultfs.New()
	cleanDir := t.TempDir()
	powerCutRunOf(t, ffs, cleanDir, p.workload)
	total := ffs.Ops()
	if total < 50 {
		t.Fatalf("the workload made %d file-system calls; want far more", total)
	}
	st, err := logfirst.Open(cleanDir, powerCutOptions(ffs))
	if err != nil {
		t.Fatalf("Open after the clean run: %v", err)
	}
	p.completed(t, st)
	if err := st.Close(); err != nil {
		t.Fatalf("Close after the clean run: %v", err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("crash seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, p.stream))
	runs := p.runs
	if *powerCutLong {
		runs *= 10
	}
	var cuts []uint64
	for len(cuts) < runs {
		for i := range total + 10 {
			cuts = append(cuts, i)
		}
	}
	for n, at := range cuts {
		ffs := faultfs.New()
		// Every other run, creates and removes may reach the disk without
		// a directory sync, in order (a journaling file system).
		ffs.SetJournaled(n%2 == 1)
		ffs.SetRule(faultfs.CutAt(at))
		dir := t.TempDir()
		log := powerCutRunOf(t, ffs, dir, p.workload)
		op, cut := ffs.CutOp()
		if err := ffs.Crash(rng); err != nil {
			t.Fatalf("cut at %v: Crash: %v", op, err)
		}
		dir = offlineTools(prefixed{t, op}, n, ffs, dir, p.compact)
		st, err := logfirst.Open(dir, powerCutOptions(ffs))
		if err != nil {
			t.Fatalf("run %d, cut at %v (cut=%v): Open after the power cut: %v", n, op, cut, err)
		}
		if p.gaps != nil {
			reports, err := participant.Inspect(st)
			if err != nil {
				t.Fatalf("run %d, cut at %v: Inspect after the power cut: %v", n, op, err)
			}
			for _, r := range reports {
				if r.Repairs > 0 {
					*p.gaps++
				}
			}
		}
		participanttest.CheckInvariants(prefixed{t, op}, st, log)
		if !cut {
			p.completed(prefixed{t, op}, st)
		}
		if err := st.Close(); err != nil {
			t.Fatalf("run %d: Close after the check: %v", n, err)
		}
	}
	t.Logf("%d power cuts over %d file-system calls", len(cuts), total)
}

// TestPowerCut runs the real service on the log-first store with its log
// on faultfs (and its bbolt commits through it), cuts the power at a
// file-system call, keeps what faultfs's strict model says survives (no
// unsynced directory entry; of unsynced writes a torn prefix or any
// subset of sectors; a bbolt commit in progress torn), reopens and checks
// the cut loop's invariants: every answered operation is there and
// replays, the outbox is the projection of the oplog, seqs have no gap or
// duplicate, bindings end at most once. The log-first store is a
// store.Compactor, so the workload's checkpoint, compaction and deletion
// passes wrote byte values and trims through its log: every cut point
// meets them too.
func TestPowerCut(t *testing.T) {
	powerCutLoop{workload: participanttest.CutWorkload, completed: participanttest.CheckCompacted,
		compact: participant.Options{Retain: time.Nanosecond, Now: time.Now}, runs: powerCutRuns, stream: 1}.run(t)
}

// TestPowerCut_GroupCommitBetweenTheBarriers is TestPowerCut with
// another writer's group commit landing before every outbox append
// (faultstore.FlushFirst): the log-first store keeps its writes' order,
// so each batch's barriers share one sync, and the oplog rows then reach
// the log in a record of their own. A power cut before the batch's own
// record leaves them without their outbox rows; the start must repair
// every such gap (CheckInvariants), and some cut must leave one.
func TestPowerCut_GroupCommitBetweenTheBarriers(t *testing.T) {
	gaps := 0
	flushFirst := func(s store.DurableStore, log *[]participanttest.Answered) error {
		s.(*faultstore.Store).AddRule(faultstore.When(faultstore.FlushFirst, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(outbox.StreamPrefix)))
		return participanttest.CutWorkload(s, log)
	}
	runs := 500
	if testing.Short() {
		runs = 150
	}
	powerCutLoop{workload: flushFirst, completed: participanttest.CheckCompacted,
		compact: participant.Options{Retain: time.Nanosecond, Now: time.Now}, runs: runs, stream: 7, gaps: &gaps}.run(t)
	if gaps == 0 {
		t.Fatalf("no power cut left a gap for reconciliation to repair")
	}
	t.Logf("%d power cuts left a gap that the start repaired", gaps)
}

// offlineTools runs participantctl's offline tools (package offline) on
// dir, the data directory a power cut left, as an operator would before
// the next start: every run inspects and verifies it, which must change
// no byte of the file or the log and refuse nothing; run n then, in turn,
// compacts it with compact (participant.Options of the workload's window
// and a clock past its end), or takes a backup of it and restores that
// into a new directory. It returns the directory the next start opens:
// dir, or the restored one. The caller checks the invariants there, so
// that a tool that loses a log record (a floor or a checkpoint written
// back under what compact removed, a backup without the log's tail)
// fails the loop.
func offlineTools(t prefixed, n int, ffs *faultfs.FS, dir string, compact participant.Options) string {
	t.Helper()
	ctx := context.Background()
	opts := offline.Options{LogFS: ffs, LogSegmentSize: powerCutOptions(ffs).SegmentSize}
	file := filepath.Join(dir, offline.StoreFile)
	before, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return dir // the power failed before the first start made the file
	}
	if err != nil {
		t.Fatalf("read the data file: %v", err)
	}
	ops := ffs.Ops()
	_, reports, err := offline.Inspect(dir, opts)
	switch {
	case errors.Is(err, store.ErrNoData):
		return dir // the file exists, empty: the first start's layout is not written
	case err != nil:
		t.Fatalf("inspect after the power cut: %v", err)
	}
	for _, r := range reports {
		if r.Refused != nil {
			t.Fatalf("verify after the power cut: conversation %v refused %+v", r.Conversation, r.Refused)
		}
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(after, before) || ffs.Ops() != ops {
		t.Fatalf("inspect changed the data directory (file changed: %v, %v; log calls %d, want %d)", !bytes.Equal(after, before), err, ffs.Ops(), ops)
	}
	if n%2 == 0 {
		if _, err := offline.Compact(ctx, dir, opts, compact); err != nil {
			t.Fatalf("compact after the power cut: %v", err)
		}
		return dir
	}
	var copy bytes.Buffer
	if _, err := offline.Backup(dir, opts, &copy, nil); err != nil {
		t.Fatalf("backup after the power cut: %v", err)
	}
	restored := filepath.Join(t.TempDir(), "restored")
	if err := os.MkdirAll(restored, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(restored, offline.StoreFile), copy.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return restored
}

// powerCutRuns is how many power cuts a normal run makes at least; -long
// makes ten times as many.
const powerCutRuns = 2000

// prefixed names the cut op in failures.
type prefixed struct {
	*testing.T
	op faultfs.Op
}

func (p prefixed) Errorf(format string, args ...any) {
	p.T.Helper()
	p.T.Errorf("cut at %v: "+format, append([]any{p.op}, args...)...)
}

func (p prefixed) Fatalf(format string, args ...any) {
	p.T.Helper()
	p.T.Fatalf("cut at %v: "+format, append([]any{p.op}, args...)...)
}

// TestPowerCut_TokenWindow is TestPowerCut for participanttest's
// WindowWorkload, whose compaction passes raise the token floor and
// forget tokens through the log: at every one of its file-system calls,
// several times over, every answered tell replays or is token_expired
// after the power cut, never committed again. Offline compact runs ten
// minutes after the workload's clock stopped: it forgets every token the
// live passes did not.
func TestPowerCut_TokenWindow(t *testing.T) {
	later := participanttest.NewClock(participanttest.WindowEpoch.Add(10 * time.Minute))
	powerCutLoop{workload: participanttest.WindowWorkload, completed: participanttest.CheckForgotten,
		compact: participant.Options{Retain: time.Second, TokenWindow: time.Minute, TokenSkew: time.Second, Now: later.Now},
		runs:    500, stream: 2}.run(t)
}

// TestPowerCut_MaxUnackedAge is TestPowerCut for participanttest's
// ReleaseWorkload, whose compaction passes commit Release rows for the
// records a deaf recipient never acknowledged and then trim them, through
// the log: at every one of its file-system calls, several times over, the
// invariants hold after the power cut and the offline tools, and a run the
// cut left complete released what it should (CheckReleased).
func TestPowerCut_MaxUnackedAge(t *testing.T) {
	powerCutLoop{workload: participanttest.ReleaseWorkload, completed: participanttest.CheckReleased,
		compact: participant.Options{Retain: time.Nanosecond, Now: time.Now}, runs: 500, stream: 3}.run(t)
}

// failedSyncs runs workload with the first fdatasync of a log segment (or
// commit of the bbolt file, for the kinds given) at or after op at failing
// the way Linux fails it (faultfs.FailSync: the pages marked clean
// unwritten, still served by the page cache), for every at of a clean
// run's calls: the store fails, and a restart without a reboot opens it
// from the page cache and checks the invariants (reconciling, replaying
// every answer: it builds on what it read); then the power is cut, the
// strict model decides what survives, the offline tools run, and a start
// must hold every answered operation and the invariants.
func (p powerCutLoop) failedSyncs(t *testing.T, kinds ...faultfs.OpKind) {
	t.Helper()
	clean := faultfs.New()
	powerCutRunOf(t, clean, t.TempDir(), p.workload)
	total := clean.Ops()
	seed := uint64(time.Now().UnixNano())
	t.Logf("crash seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, p.stream))
	failed := 0
	for at := range total {
		ffs := faultfs.New()
		ffs.SetJournaled(at%2 == 1)
		// The rule runs on the store's goroutines (its flusher, its
		// checkpointer) while the test reads what it did.
		var (
			mu       sync.Mutex
			failedOp faultfs.Op
			done     bool
		)
		isDone := func() bool { mu.Lock(); defer mu.Unlock(); return done }
		ffs.SetRule(func(op faultfs.Op) faultfs.Action {
			mu.Lock()
			defer mu.Unlock()
			if done || op.Index < at || !slices.Contains(kinds, op.Kind) {
				return faultfs.None
			}
			if op.Kind == faultfs.OpSync && filepath.Base(filepath.Dir(op.Path)) != logfirst.WALDir {
				return faultfs.None // the marker file, not the log
			}
			done, failedOp = true, op
			return faultfs.FailSync
		})
		dir := t.TempDir()
		log := faultedRunOf(t, ffs, dir, p.workload, isDone)
		if !isDone() {
			break // past the last sync: every later at is the clean run
		}
		failed++
		mu.Lock()
		pt := prefixed{t, failedOp}
		mu.Unlock()
		ffs.SetRule(nil)
		if _, err := os.Stat(filepath.Join(dir, logfirst.DBFile)); err == nil {
			// The restart without a reboot.
			st, err := logfirst.Open(dir, powerCutOptions(ffs))
			if err != nil {
				pt.Fatalf("restart after the failed sync: %v", err)
			}
			participanttest.CheckInvariants(pt, st, log)
			if err := st.Close(); err != nil {
				pt.Fatalf("Close after the restart: %v", err)
			}
		}
		if err := ffs.Crash(rng); err != nil {
			pt.Fatalf("Crash: %v", err)
		}
		dir = offlineTools(pt, int(at), ffs, dir, p.compact)
		st, err := logfirst.Open(dir, powerCutOptions(ffs))
		if err != nil {
			pt.Fatalf("Open after the failed sync, a restart and a power cut: %v", err)
		}
		participanttest.CheckInvariants(pt, st, log)
		if err := st.Close(); err != nil {
			pt.Fatalf("Close after the check: %v", err)
		}
	}
	if failed < 20 {
		t.Fatalf("%d runs met a failed sync; want far more", failed)
	}
	t.Logf("%d failed syncs over %d file-system calls", failed, total)
}

// TestPowerCut_FailedSync is TestPowerCut's workload with a log
// fdatasync or a bbolt commit (a checkpoint, the replay of a start)
// failing the Linux way at every one of them in turn, then a restart from
// the page cache, then a power cut (see failedSyncs).
func TestPowerCut_FailedSync(t *testing.T) {
	t.Run("CutWorkload", func(t *testing.T) {
		powerCutLoop{workload: participanttest.CutWorkload, compact: participant.Options{Retain: time.Nanosecond, Now: time.Now}, stream: 4}.
			failedSyncs(t, faultfs.OpSync, faultfs.OpCommit, faultfs.OpSyncDir)
	})
	t.Run("TokenWindow", func(t *testing.T) {
		later := participanttest.NewClock(participanttest.WindowEpoch.Add(10 * time.Minute))
		powerCutLoop{workload: participanttest.WindowWorkload,
			compact: participant.Options{Retain: time.Second, TokenWindow: time.Minute, TokenSkew: time.Second, Now: later.Now}, stream: 5}.
			failedSyncs(t, faultfs.OpSync, faultfs.OpCommit, faultfs.OpSyncDir)
	})
	t.Run("MaxUnackedAge", func(t *testing.T) {
		powerCutLoop{workload: participanttest.ReleaseWorkload, compact: participant.Options{Retain: time.Nanosecond, Now: time.Now}, stream: 6}.
			failedSyncs(t, faultfs.OpSync, faultfs.OpCommit, faultfs.OpSyncDir)
	})
}
