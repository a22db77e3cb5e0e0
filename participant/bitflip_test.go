package participant_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/faultfs"

	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// TestBitFlip_TellPayloadInTheCheckpointFile_NeverServed tells "transfer
// 100 to alice" on a log-first store, closes it (the tell is checkpointed
// into participantd.db), and flips the one bit that makes each stored copy
// of the payload read "transfer 900 to alice", one copy per run. The
// damaged copy must never be served: the conversation is contained as
// unloadable at the next start, and the offline verification refuses it.
func TestBitFlip_TellPayloadInTheCheckpointFile_NeverServed(t *testing.T) {
	ctx := context.Background()
	want := []byte("transfer 100 to alice")
	flipped := []byte("transfer 900 to alice") // '1' ^ 0x08 == '9'
	key := make([]byte, participant.NodeKeySize)

	build := func(t *testing.T) (dir string, recipient participant.Bound) {
		dir = t.TempDir()
		st, err := logfirst.Open(dir, logfirst.Options{})
		if err != nil {
			t.Fatal(err)
		}
		svc, err := participant.Open(ctx, st, participant.Options{NodeKey: key})
		if err != nil {
			t.Fatal(err)
		}
		tc := svc.Connect(nil)
		teller, err := tc.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{1}})
		if err != nil {
			t.Fatal(err)
		}
		if recipient, err = svc.Connect(nil).Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{2}}); err != nil {
			t.Fatal(err)
		}
		if _, err := tc.Tell(ctx, participant.Tell{Conversation: 1, Participant: teller.Participant,
			Generation: teller.Generation, Token: participant.Token{3}, Payload: want}); err != nil {
			t.Fatal(err)
		}
		if err := svc.Close(); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return dir, recipient
	}

	dir, _ := build(t)
	raw, err := os.ReadFile(filepath.Join(dir, logfirst.DBFile))
	if err != nil {
		t.Fatal(err)
	}
	copies := bytes.Count(raw, want)
	if copies == 0 {
		t.Fatalf("%s holds no copy of %q: the tell was not checkpointed", logfirst.DBFile, want)
	}
	for i := range copies {
		dir, recipient := build(t)
		path := filepath.Join(dir, logfirst.DBFile)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		at := 0
		for range i + 1 {
			at += bytes.Index(raw[at:], want) + 1
		}
		at--
		raw[at+len("transfer ")] ^= 0x08
		if !bytes.Equal(raw[at:at+len(flipped)], flipped) {
			t.Fatalf("flip = %q, want %q", raw[at:at+len(flipped)], flipped)
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}

		_, reports, err := offline.Inspect(dir, offline.Options{})
		switch {
		case err != nil && !errors.Is(err, store.ErrCorrupt):
			t.Errorf("copy %d: verify = %v, want the damage refused (store.ErrCorrupt)", i, err)
		case err == nil && (len(reports) != 1 || reports[0].Refused == nil):
			t.Errorf("copy %d: verify = %+v, want the damage refused", i, reports)
		}

		st, err := logfirst.Open(dir, logfirst.Options{})
		if err != nil {
			continue // refused at open: never served
		}
		svc, err := participant.Open(ctx, st, participant.Options{NodeKey: key})
		if err != nil {
			st.Close()
			continue
		}
		c := svc.Connect(nil)
		_, aerr := c.Attach(ctx, participant.Attach{Conversation: 1, Participant: recipient.Participant,
			Generation: recipient.Generation, Secret: recipient.Secret, Token: participant.Token{4}})
		for {
			d, ok := c.Next(1)
			if !ok {
				break
			}
			if d.Kind == outbox.KindRecord && !bytes.Equal(d.Payload, want) {
				t.Errorf("copy %d: served %q, acknowledged as %q", i, d.Payload, want)
			}
		}
		if aerr == nil {
			t.Errorf("copy %d: Attach after the flip succeeded, want the conversation contained", i)
		} else if !errors.Is(aerr, participant.ErrUnavailable) {
			t.Errorf("copy %d: Attach after the flip = %v, want unavailable", i, aerr)
		}
		unl := svc.Unloadable()
		if len(unl) != 1 || !strings.Contains(unl[0].Class, "corrupt") {
			t.Errorf("copy %d: Unloadable() = %+v, want conversation 1 contained with a corruption class", i, unl)
		}
		svc.Close()
		st.Close()
	}
}

// flipDir is a small data directory for the bit-flip run: conversation 1
// with a teller and a recipient, records told before a checkpoint (in
// participantd.db) and after it (in the log alone), as a power cut
// leaves it; and what its acknowledged operations answered.
type flipDir struct {
	dir     string
	teller  participant.Bound
	recip   participant.Bound
	tells   []participant.Tell
	answers []participant.Told
}

const flipSegment = 8 << 10

// buildFlipDir builds a flipDir: the log runs on a faultfs, which is cut
// when the store closes (so the last records stay in the log, after the
// checkpoint) and then copied to dir on the disk.
func buildFlipDir(t *testing.T) *flipDir {
	t.Helper()
	ctx := context.Background()
	key := make([]byte, participant.NodeKeySize)
	ffs := faultfs.New()
	fd := &flipDir{dir: filepath.Join(t.TempDir(), "data")}
	opts := logfirst.Options{FS: ffs, SegmentSize: flipSegment, CheckpointInterval: time.Hour, CheckpointBytes: 1 << 30}
	for phase := range 2 {
		st, err := logfirst.Open(fd.dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		svc, err := participant.Open(ctx, st, participant.Options{NodeKey: key})
		if err != nil {
			t.Fatal(err)
		}
		tc, rc := svc.Connect(nil), svc.Connect(nil)
		if phase == 0 {
			if fd.teller, err = tc.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{1}}); err != nil {
				t.Fatal(err)
			}
			if fd.recip, err = rc.Enroll(ctx, participant.Enroll{Conversation: 1, Token: participant.Token{2}}); err != nil {
				t.Fatal(err)
			}
		} else if fd.teller, err = tc.Attach(ctx, participant.Attach{Conversation: 1, Participant: fd.teller.Participant,
			Generation: fd.teller.Generation, Secret: fd.teller.Secret, Token: participant.Token{10}}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			tell := participant.Tell{Conversation: 1, Participant: fd.teller.Participant, Generation: fd.teller.Generation,
				Token: participant.Token{3, byte(phase), byte(i)}, Payload: fmt.Appendf(nil, "transfer %d to alice", 100*(3*phase+i+1))}
			told, err := tc.Tell(ctx, tell)
			if err != nil {
				t.Fatal(err)
			}
			fd.tells, fd.answers = append(fd.tells, tell), append(fd.answers, told)
		}
		if err := svc.Close(); err != nil {
			t.Fatal(err)
		}
		if phase == 1 {
			// The power fails at the next call: Close's checkpoint.
			ffs.SetRule(faultfs.CutAt(ffs.Ops()))
		}
		if err := st.Close(); err != nil && phase == 0 {
			t.Fatal(err)
		}
	}
	if err := ffs.Crash(nil); err != nil {
		t.Fatal(err)
	}
	// The log's files, from the faultfs to the disk.
	for _, sub := range []string{"", logfirst.WALDir} {
		names, err := ffs.List(filepath.Join(fd.dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			path := filepath.Join(fd.dir, sub, name)
			if name == logfirst.DBFile || name == logfirst.WALDir {
				continue
			}
			f, err := ffs.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			size, err := f.Size()
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, size)
			if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			f.Close()
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return fd
}

// flipServed is what a data directory serves: the recipient's deliveries
// after an attach, and the answers of the teller's tells retried.
type flipServed struct {
	Deliveries []string
	Retries    []string
}

// serveFlipDir opens a copy of dir as the daemon would and returns what
// it serves, or refused (with why) when a start, an attach or a retry is
// refused as damage: an open error, or unavailable (the conversation
// contained). Any other refusal is an answer, and is returned as one.
func serveFlipDir(t *testing.T, fd *flipDir, dir string) (got flipServed, refused error) {
	t.Helper()
	ctx := context.Background()
	st, err := logfirst.Open(dir, logfirst.Options{SegmentSize: flipSegment})
	if err != nil {
		return got, err
	}
	defer st.Close()
	svc, err := participant.Open(ctx, st, participant.Options{NodeKey: make([]byte, participant.NodeKeySize)})
	if err != nil {
		return got, err
	}
	defer svc.Close()
	answer := func(err error) error {
		if errors.Is(err, participant.ErrUnavailable) {
			return err
		}
		got.Retries = append(got.Retries, fmt.Sprintf("error %v", err))
		return nil
	}
	tc, rc := svc.Connect(nil), svc.Connect(nil)
	for _, b := range []struct {
		c   *participant.Conn
		b   participant.Bound
		tok byte
	}{{tc, fd.teller, 200}, {rc, fd.recip, 201}} {
		if _, err := b.c.Attach(ctx, participant.Attach{Conversation: 1, Participant: b.b.Participant,
			Generation: b.b.Generation, Secret: b.b.Secret, Token: participant.Token{b.tok}}); err != nil {
			return got, answer(err)
		}
	}
	for {
		d, ok := rc.Next(1)
		if !ok {
			break
		}
		got.Deliveries = append(got.Deliveries, fmt.Sprintf("%v %v %q", d.Kind, d.Seq, d.Payload))
	}
	for _, tell := range fd.tells {
		told, err := tc.Tell(ctx, tell)
		if err != nil {
			if r := answer(err); r != nil {
				return got, r
			}
			continue
		}
		got.Retries = append(got.Retries, fmt.Sprintf("seq %v replay %v", told.Seq, told.Replay))
	}
	return got, nil
}

var flipSeed = flag.Uint64("flip-seed", 0, "the seed of TestBitFlip_EveryByte's offsets and bits (0: drawn)")

var flipStride = flag.Int64("flip-stride", 0, "TestBitFlip_EveryByte flips every n-th byte of each file (1: every byte); 0: 1021 with -short, else 257")

// TestBitFlip_EveryByteOfADataDirectoryAndABackup is the bit-flip fault
// model (faultfs.FlipBits): it flips a bit of every byte (-flip-stride 1)
// or of a sample at a stride (1021 with -short, 257 without) of each file of a small data directory
// (participantd.db, the log's segments and marker) and of a backup of it
// restored. Each flip must be refused (an open, a restore check or an
// attach refused as damage: the conversation contained) or harmless:
// every delivery and every retried answer byte for byte what the
// undamaged directory serves, which is what was acknowledged. A
// different answer served fails the test, naming the file and offset.
func TestBitFlip_EveryByteOfADataDirectoryAndABackup(t *testing.T) {
	fd := buildFlipDir(t)
	want, err := serveFlipDir(t, fd, copyTree(t, fd.dir))
	if err != nil {
		t.Fatalf("the undamaged directory refused: %v", err)
	}
	for i, told := range fd.answers {
		if w := fmt.Sprintf("seq %v replay %v", told.Seq, participant.ReplayCommitted); want.Retries[i] != w {
			t.Fatalf("retry %d of the undamaged directory = %s, want %s", i, want.Retries[i], w)
		}
	}
	// The backup: a copy of the store, restored alone.
	var backup bytes.Buffer
	if _, err := offline.Backup(copyTree(t, fd.dir), offline.Options{}, &backup, nil); err != nil {
		t.Fatal(err)
	}
	backupDir := filepath.Join(t.TempDir(), "restored")
	if err := os.MkdirAll(backupDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(backupDir, logfirst.DBFile), backup.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	stride := int64(257)
	switch {
	case *flipStride > 0:
		stride = *flipStride
	case testing.Short():
		stride = 1021
	}
	seed := *flipSeed
	if seed == 0 {
		seed = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0)).Uint64()
	}
	t.Logf("seed %d (stride %d)", seed, stride)
	rng := rand.New(rand.NewPCG(seed, 0))
	var flips, refusedN int
	for _, src := range []string{fd.dir, backupDir} {
		var files []string
		if err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, path)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			rel, _ := filepath.Rel(src, file)
			info, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			for _, off := range faultfs.FlipOffsets(info.Size(), stride, rng) {
				mask := byte(1) << rng.IntN(8)
				dir := copyTree(t, src)
				if err := faultfs.FlipBits(filepath.Join(dir, rel), off, mask); err != nil {
					t.Fatal(err)
				}
				flips++
				if src == backupDir {
					// restore checks the file whole before it writes it.
					if err := offline.CheckFile(filepath.Join(dir, rel), offline.Options{}); err != nil {
						refusedN++
						os.RemoveAll(dir)
						continue
					}
				}
				got, refused := serveFlipDir(t, fd, dir)
				os.RemoveAll(dir)
				if refused != nil {
					refusedN++
					continue
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s %s: byte %d ^ %#02x served a different answer (seed %d) (-acknowledged +served):\n%s",
						filepath.Base(src), rel, off, mask, seed, diff)
				}
			}
		}
	}
	t.Logf("%d flips: %d refused, %d harmless", flips, refusedN, flips-refusedN)
}

// copyTree copies directory src to a new temporary directory.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst, err := os.MkdirTemp(t.TempDir(), "copy")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestBitFlip_TheLastLogRecordOfAnAnsweredTell flips a bit in every byte
// the log's last segment holds past its header (every seventh with
// -short): its records, the last of which carries the last answered
// tell's oplog and outbox rows together (one sync for both barriers). A
// damaged record, the last included, is refused, never cut as a torn
// tail: each flip must be refused, and nothing served. Failed while the
// log's format could not tell a damaged last record from a torn one
// (segment format 1: the record cut, the tell lost, its retry refused
// stale_authority), with one sync; with a flush per barrier the cut
// record held outbox rows alone, which reconciliation re-derived.
func TestBitFlip_TheLastLogRecordOfAnAnsweredTell(t *testing.T) {
	fd := buildFlipDir(t)
	want, err := serveFlipDir(t, fd, copyTree(t, fd.dir))
	if err != nil {
		t.Fatalf("the undamaged directory refused: %v", err)
	}
	segs, err := filepath.Glob(filepath.Join(fd.dir, "wal", "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no log segment in %s: %v", fd.dir, err)
	}
	last := segs[len(segs)-1] // names are zero-padded LSNs: sorted
	b, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	end := len(b) - 1
	for end >= 0 && b[end] == 0 {
		end--
	}
	rel, _ := filepath.Rel(fd.dir, last)
	step := 1
	if testing.Short() {
		step = 7
	}
	const segmentHeader = 16
	for off := segmentHeader; off <= end; off += step {
		dir := copyTree(t, fd.dir)
		mask := byte(1) << (off % 8)
		if err := faultfs.FlipBits(filepath.Join(dir, rel), int64(off), mask); err != nil {
			t.Fatal(err)
		}
		got, refused := serveFlipDir(t, fd, dir)
		os.RemoveAll(dir)
		if refused != nil {
			continue
		}
		t.Errorf("%s: byte %d ^ %#02x of %d was not refused", rel, off, mask, end+1)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("%s: byte %d ^ %#02x served a different answer (-acknowledged +served):\n%s", rel, off, mask, diff)
		}
	}
}
