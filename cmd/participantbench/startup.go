package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/store/logfirst"
)

// startupFigure is the time to ready of one data directory size.
type startupFigure struct {
	Conversations int     `json:"conversations"`
	Records       int     `json:"records"`
	FileBytes     int64   `json:"file_bytes"`
	BuildSeconds  float64 `json:"build_seconds"`
	ReadySeconds  float64 `json:"ready_seconds"`
	// CheckpointReadySeconds is the time to ready of a copy of the same
	// data with a checkpoint of every conversation (--startup-checkpoints).
	CheckpointReadySeconds float64 `json:"checkpoint_ready_seconds,omitempty"`
	// ReadyPeakHeap and CheckpointPeakHeap are the Go heap's peak during
	// each start, above the heap before it.
	ReadyPeakHeap      int64 `json:"ready_peak_heap_bytes"`
	CheckpointPeakHeap int64 `json:"checkpoint_peak_heap_bytes,omitempty"`
	// CheckpointCPUSeconds is the process's CPU time (user and system)
	// during the start from checkpoints: the rest of its time it waited.
	CheckpointCPUSeconds float64 `json:"checkpoint_cpu_seconds,omitempty"`
	// RestartReadySeconds and RestartPeakHeap are a second start of the
	// checkpointed copy, after the first stopped cleanly: a restart of a
	// server that ran, with its log.
	RestartReadySeconds float64 `json:"restart_ready_seconds,omitempty"`
	RestartPeakHeap     int64   `json:"restart_peak_heap_bytes,omitempty"`
	// CrashLog is the start from the checkpointed copy again, after a
	// crash left its log full (--startup-crash-segments).
	CrashLog *crashLogFigure `json:"crash_log,omitempty"`
}

// crashLogFigure is a start that replays a log a crash left with no
// checkpoint in it.
type crashLogFigure struct {
	Segments     int     `json:"segments"`
	Records      int     `json:"records"`
	Bytes        int64   `json:"bytes"` // the segments' bytes up to their last record
	ReadySeconds float64 `json:"ready_seconds"`
	PeakHeap     int64   `json:"peak_heap_bytes"`
	Allocated    int64   `json:"allocated_bytes"`
}

// runStartup builds data directories of 1/10, 3/10 and all of
// f.startupRecords tell records over as many tenths of
// f.startupConversations conversations, and times an embedded server from
// Run to a 200 on /ready for each. Each conversation has two participants,
// both left bound, as a crash leaves them: the start must end every binding
// as died/unclean_restart through the two barriers, on top of reconciling.
func runStartup(ctx context.Context, e *env, f *benchFlags) error {
	rep := &benchReport{Machine: thisMachine()}
	root := f.dataDir
	if root == "" {
		dir, err := os.MkdirTemp("", "participantd-startup-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		root = dir
	}
	rep.DataDir = root
	if f.probe {
		rate, err := fsyncProbe(root, f.probeDuration)
		if err != nil {
			return err
		}
		rep.FsyncPerSec = rate
	}
	for _, tenths := range []int{1, 3, 10} {
		convs := max(1, f.startupConversations*tenths/10)
		if f.startupFixed {
			convs = f.startupConversations
		}
		records := f.startupRecords * tenths / 10
		dir := filepath.Join(root, fmt.Sprintf("size-%d", tenths))
		fig := startupFigure{Conversations: convs, Records: records}
		start := time.Now()
		if err := buildDataDir(ctx, dir, convs, records, f.load.payload, f.startupCheckpoints); err != nil {
			return err
		}
		fig.BuildSeconds = time.Since(start).Seconds()
		if fi, err := os.Stat(filepath.Join(dir, server.StoreFile)); err == nil {
			fig.FileBytes = fi.Size()
		}
		var ckDir string
		if f.startupCheckpoints {
			// The copy is checkpointed before either start, so both starts
			// find the same leftover bindings to end.
			ckDir = dir + "-checkpointed"
			if err := checkpointedCopy(ctx, dir, ckDir); err != nil {
				return err
			}
		}
		ready, err := timeToReady(ctx, dir, "")
		if err != nil {
			return err
		}
		fig.ReadySeconds, fig.ReadyPeakHeap = ready.seconds, ready.peakHeap
		if ckDir != "" {
			profile := ""
			if f.cpuProfile != "" {
				profile = fmt.Sprintf("%s.%d", f.cpuProfile, records)
			}
			ready, err := timeToReady(ctx, ckDir, profile)
			if err != nil {
				return err
			}
			fig.CheckpointReadySeconds, fig.CheckpointPeakHeap = ready.seconds, ready.peakHeap
			fig.CheckpointCPUSeconds = ready.cpu
			// The start closed cleanly: a restart now reads the log it
			// began (its last segment to the end) and replays nothing.
			restart, err := timeToReady(ctx, ckDir, "")
			if err != nil {
				return err
			}
			fig.RestartReadySeconds, fig.RestartPeakHeap = restart.seconds, restart.peakHeap
			if f.startupCrashSegments > 0 {
				if fig.CrashLog, err = timeCrashLog(ctx, ckDir, f.startupCrashSegments); err != nil {
					return err
				}
			}
			os.RemoveAll(ckDir)
		}
		rep.Startup = append(rep.Startup, fig)
		os.RemoveAll(dir)
	}
	return rep.print(e.stdout, f.json)
}

// readyFigure is one timed start.
type readyFigure struct {
	seconds float64
	cpu     float64 // the process's CPU seconds during it
	// peakHeap is the most the Go heap's objects (live, and dead not yet
	// swept) held during the start, sampled every millisecond, above what
	// they held before it; allocated is the bytes allocated during it.
	peakHeap, allocated int64
}

// timeToReady starts a server on dir and returns the time from Run to the
// first 200 of GET /ready, and the heap and CPU it took; with profile, it
// writes a CPU profile of the start there.
func timeToReady(ctx context.Context, dir, profile string) (readyFigure, error) {
	srv, err := server.New(server.Config{DataDir: dir, Listen: "127.0.0.1:0", HealthListen: "127.0.0.1:0"})
	if err != nil {
		return readyFigure{}, err
	}
	if profile != "" {
		stop, err := startCPUProfile(profile)
		if err != nil {
			return readyFigure{}, err
		}
		defer stop()
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	runtime.GC()
	heap := startHeapSampler()
	cpu0 := cpuSeconds()
	start := time.Now()
	go func() { done <- srv.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()
	url := "http://" + srv.HealthAddr().String() + "/ready"
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fig := readyFigure{seconds: time.Since(start).Seconds(), cpu: cpuSeconds() - cpu0}
				fig.peakHeap, fig.allocated = heap.stop()
				return fig, nil
			}
		}
		select {
		case err := <-done:
			done <- err
			heap.stop()
			return readyFigure{}, fmt.Errorf("server on %s ended before ready: %w", dir, err)
		case <-ctx.Done():
			heap.stop()
			return readyFigure{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cpuSeconds returns the process's user and system CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// heapSampler samples the Go heap every millisecond until stopped.
type heapSampler struct {
	quit chan struct{}
	done chan struct{}
	base int64 // heap objects at the start
	// allocs0 is the bytes allocated before the start.
	allocs0 int64
	peak    int64
}

var heapMetrics = []string{"/memory/classes/heap/objects:bytes", "/gc/heap/allocs:bytes"}

func readHeap() (objects, allocs int64) {
	s := []metrics.Sample{{Name: heapMetrics[0]}, {Name: heapMetrics[1]}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64())
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{quit: make(chan struct{}), done: make(chan struct{})}
	h.base, h.allocs0 = readHeap()
	h.peak = h.base
	go func() {
		defer close(h.done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if v, _ := readHeap(); v > h.peak {
				h.peak = v
			}
			select {
			case <-h.quit:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

// stop ends the sampling and returns the peak above the start and the
// bytes allocated since.
func (h *heapSampler) stop() (peak, allocated int64) {
	close(h.quit)
	<-h.done
	_, allocs := readHeap()
	return h.peak - h.base, allocs - h.allocs0
}

// timeCrashLog runs the crash writer on dir, a data directory a server
// has started on, until its log holds segments full segments and it
// stops without closing, then times a start on it.
func timeCrashLog(ctx context.Context, dir string, segments int) (*crashLogFigure, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "--startup-crash-writer", dir, "--startup-crash-segments", strconv.Itoa(segments))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("crash writer on %s: %w", dir, err)
	}
	fig := &crashLogFigure{}
	walDir := filepath.Join(dir, logfirst.WALDir)
	st, err := logfirst.OpenReadOnly(dir, logfirst.Options{})
	if err != nil {
		return nil, err
	}
	info := st.Replay().Log
	if err := st.Close(); err != nil {
		return nil, err
	}
	fig.Segments, fig.Records = info.Segments, info.Records
	if fig.Bytes, err = logBytes(walDir); err != nil {
		return nil, err
	}
	ready, err := timeToReady(ctx, dir, "")
	if err != nil {
		return nil, err
	}
	fig.ReadySeconds, fig.PeakHeap, fig.Allocated = ready.seconds, ready.peakHeap, ready.allocated
	return fig, nil
}

// logBytes returns the bytes of the segments in walDir up to the last
// byte that is not zero in each: the records, and a torn tail.
func logBytes(walDir string) (int64, error) {
	names, err := os.ReadDir(walDir)
	if err != nil {
		return 0, err
	}
	var total int64
	buf := make([]byte, 1<<20)
	for _, e := range names {
		if !strings.HasSuffix(e.Name(), ".wal") {
			continue
		}
		f, err := os.Open(filepath.Join(walDir, e.Name()))
		if err != nil {
			return 0, err
		}
		var used int64
		for off := int64(0); ; off += int64(len(buf)) {
			n, err := f.ReadAt(buf, off)
			for i := n - 1; i >= 0; i-- {
				if buf[i] != 0 {
					used = off + int64(i) + 1
					break
				}
			}
			if err != nil {
				break
			}
		}
		f.Close()
		total += used
	}
	return total, nil
}

// crashConversations is where the crash writer's conversations start,
// past any the bench builds.
const crashConversations = 1 << 40

// runCrashWriter opens the store of data directory dir with checkpoints
// held off, and tells into new conversations from 64 senders until the
// log holds segments full segments past the one it started with; then it
// exits without closing anything, as a crash does: the records are in
// the log (and the page cache) and none is checkpointed.
func runCrashWriter(ctx context.Context, dir string, segments int) error {
	if segments <= 0 {
		return errors.New("--startup-crash-segments must be positive")
	}
	key, err := participant.LoadOrCreateNodeKey(dir)
	if err != nil {
		return err
	}
	st, err := logfirst.Open(dir, logfirst.Options{MustExist: true, CheckpointInterval: 24 * time.Hour, CheckpointBytes: 1 << 50, MaxUncheckpointed: 1 << 50})
	if err != nil {
		return err
	}
	svc, err := participant.Open(ctx, st, participant.Options{NodeKey: key, CheckpointInterval: 24 * time.Hour})
	if err != nil {
		return err
	}
	walDir := filepath.Join(dir, logfirst.WALDir)
	countSegments := func() (int, error) {
		names, err := os.ReadDir(walDir)
		n := 0
		for _, e := range names {
			if strings.HasSuffix(e.Name(), ".wal") {
				n++
			}
		}
		return n, err
	}
	first, err := countSegments()
	if err != nil {
		return err
	}
	body := make([]byte, 4<<10)
	var next atomic.Uint64
	errs := make(chan error, 64)
	for range 64 {
		go func() {
			for {
				conv := participant.ConversationID(crashConversations + next.Add(1))
				if err := fillConversation(ctx, svc, conv, 100, body, false); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-errs:
			return err
		case <-t.C:
		}
		n, err := countSegments()
		if err != nil {
			return err
		}
		if n > first+segments-1 {
			// The segment that just began follows segments full ones,
			// the first of them the one Open began.
			os.Exit(0)
		}
	}
}

// buildDataDir writes a data directory of convs conversations holding
// records tell records in all. It runs the real service on in-memory stores
// (the rows are exactly what a server commits) and copies every stream and
// value into the bbolt file: building a million records through fsyncs
// would take minutes and measures nothing the load bench does not. The
// conversations are built in chunks of buildChunk, one service and memory
// store each, since an in-memory store's cost grows with its content.
func buildDataDir(ctx context.Context, dir string, convs, records, payload int, settle bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := participant.LoadOrCreateNodeKey(dir)
	if err != nil {
		return err
	}
	bolt, err := boltstore.Open(filepath.Join(dir, server.StoreFile), boltstore.Options{})
	if err != nil {
		return err
	}
	cp := &boltCopy{bolt: bolt}
	body := make([]byte, payload)
	for lo := 0; lo < convs && err == nil; lo += buildChunk {
		hi := min(convs, lo+buildChunk)
		err = buildChunkInto(ctx, cp, key, lo, hi, convs, records, body, settle)
	}
	if err == nil {
		err = bolt.CAS(participant.IncarnationKey, 0, cp.incarnation)
	}
	if err == nil {
		err = bolt.Flush()
	}
	if cerr := bolt.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return persistFreelist(filepath.Join(dir, server.StoreFile))
}

// persistFreelist writes the freelist of the bbolt file at path, as the
// log-first store (the default engine) keeps it, so that a timed start
// reads it instead of walking the file, as the restart of a server that
// has run does. The builders write without it (bbolt's NoFreelistSync):
// with it, each of their many small commits would write the whole
// freelist.
func persistFreelist(path string) error {
	st, err := boltstore.Open(path, boltstore.Options{PersistFreelist: true})
	if err != nil {
		return err
	}
	return st.Close()
}

const buildChunk = 100

// buildChunkInto builds conversations [lo, hi) on a fresh memory store and
// appends them to cp.
func buildChunkInto(ctx context.Context, cp *boltCopy, key []byte, lo, hi, convs, records int, body []byte, settle bool) error {
	mem := store.NewMemory()
	svc, err := participant.Open(ctx, mem, participant.Options{NodeKey: key})
	if err != nil {
		return err
	}
	jobs := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for c := range jobs {
				n := records / convs
				if c < records%convs {
					n++
				}
				if err := fillConversation(ctx, svc, participant.ConversationID(c+1), n, body, settle); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for c := lo; c < hi; c++ {
		jobs <- c
	}
	close(jobs)
	wg.Wait()
	svc.Close()
	close(errs)
	if err := errors.Join(collect(errs)...); err != nil {
		return err
	}
	return cp.from(mem, lo, hi)
}

// boltCopy appends chunks of conversations to one bbolt store.
type boltCopy struct {
	bolt        *boltstore.Store
	registry    uint64 // entries of the registry stream so far
	pending     int
	incarnation uint64
}

func (cp *boltCopy) from(mem *store.Memory, lo, hi int) error {
	reg, err := mem.ReadFrom(registry.Stream, 0, 0)
	if err != nil {
		return err
	}
	for _, en := range reg {
		if _, err := cp.bolt.Append(registry.Stream, en.Payload, cp.registry); err != nil {
			return err
		}
		cp.registry++
	}
	for c := lo + 1; c <= hi; c++ {
		id := participant.ConversationID(c)
		for _, stream := range []string{oplog.Stream(id), outbox.Stream(id)} {
			entries, err := mem.ReadFrom(stream, 0, 0)
			if err != nil {
				return err
			}
			for _, en := range entries {
				if _, err := cp.bolt.Append(stream, en.Payload, en.Seq); err != nil {
					return err
				}
			}
			cp.pending += len(entries)
		}
	}
	vals, err := mem.Scan("")
	if err != nil {
		return err
	}
	for _, v := range vals {
		if v.Key == participant.IncarnationKey {
			cp.incarnation = max(cp.incarnation, v.Value)
			continue
		}
		if err := cp.bolt.CAS(v.Key, 0, v.Value); err != nil {
			return err
		}
	}
	if cp.pending >= 20000 {
		cp.pending = 0
		return cp.bolt.Flush()
	}
	return nil
}

// fillConversation enrolls two participants in conv and tells n records
// from the first; with settle, both acknowledge everything addressed to
// them, so that a checkpoint retains no record.
func fillConversation(ctx context.Context, svc *participant.Service, conv participant.ConversationID, n int, body []byte, settle bool) error {
	tok := func(who, i uint64) participant.Token {
		var t participant.Token
		binary.BigEndian.PutUint64(t[:8], who+1)
		binary.BigEndian.PutUint64(t[8:], i+1)
		return t
	}
	sender, recipient := svc.Connect(nil), svc.Connect(nil)
	b, err := sender.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(0, 0)})
	if err != nil {
		return err
	}
	r, err := recipient.Enroll(ctx, participant.Enroll{Conversation: conv, Token: tok(1, 0)})
	if err != nil {
		return err
	}
	if settle {
		// The recipient's joined record (seq 2) is addressed to the sender.
		if _, err := sender.Ack(ctx, participant.Ack{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Through: 2}); err != nil {
			return err
		}
	}
	var last participant.Seq
	for i := range n {
		told, err := sender.Tell(ctx, participant.Tell{Conversation: conv, Participant: b.Participant, Generation: b.Generation, Token: tok(0, uint64(i+1)), Payload: body})
		if err != nil {
			return err
		}
		last = told.Seq
	}
	if settle && last > 0 {
		if _, err := recipient.Ack(ctx, participant.Ack{Conversation: conv, Participant: r.Participant, Generation: r.Generation, Through: last}); err != nil {
			return err
		}
	}
	return nil
}

// checkpointedCopy copies data directory src to dst and writes a
// checkpoint of every conversation there, as participantctl compact does
// (with a retention no record reaches, so nothing is removed).
func checkpointedCopy(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	for _, name := range []string{participant.NodeKeyFile, server.StoreFile} {
		if err := copyFile(filepath.Join(dst, name), filepath.Join(src, name)); err != nil {
			return err
		}
	}
	path := filepath.Join(dst, server.StoreFile)
	st, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		return err
	}
	_, err = participant.Compact(ctx, st, participant.Options{Retain: 1 << 62})
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return persistFreelist(path)
}

// copyFile copies src to a new file dst and syncs it, so that the start
// timed on the copy does not pay for writing it back.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
