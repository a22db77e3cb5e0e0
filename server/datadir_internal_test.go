package server

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/logfirst"
)

// TestOpenDataDir_RacingStartsServeTheKeyOnDisk starts many openDataDir at
// once on fresh directories, as racing processes would: each that gets the
// directory must hold the key that is in node.key, and they all agree.
func TestOpenDataDir_RacingStartsServeTheKeyOnDisk(t *testing.T) {
	const rounds, racers = 20, 6
	for round := 0; round < rounds; round++ {
		dir := filepath.Join(t.TempDir(), "data")
		start := make(chan struct{})
		keys := make([][]byte, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, err := openDataDir(dir, Config{Engine: EngineBolt}, zerolog.Nop())
				if err != nil {
					errs[i] = err
					return
				}
				defer d.Close()
				onDisk, err := os.ReadFile(filepath.Join(dir, participant.NodeKeyFile))
				if err != nil {
					errs[i] = err
					return
				}
				if !bytes.Equal(d.key, onDisk) {
					errs[i] = errors.New("serving a key that is not node.key's")
				}
				keys[i] = d.key
			}()
		}
		close(start)
		wg.Wait()
		for i := range racers {
			if errs[i] != nil {
				t.Fatalf("round %d racer %d: %v", round, i, errs[i])
			}
			if !bytes.Equal(keys[i], keys[0]) {
				t.Fatalf("round %d: racer %d key %x, racer 0 key %x", round, i, keys[i], keys[0])
			}
		}
	}
}

func TestOpenDataDir_SecondHolderIsRefused(t *testing.T) {
	dir := t.TempDir()
	d, err := openDataDir(dir, Config{Engine: EngineBolt}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lock, err := lockDataDir(dir, 50*time.Millisecond)
	if err == nil {
		lock.Close()
	}
	if !errors.Is(err, ErrDataDirLocked) {
		t.Errorf("lockDataDir while held = %v, want ErrDataDirLocked", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	lock, err = lockDataDir(dir, 50*time.Millisecond)
	if err != nil {
		t.Fatalf("lockDataDir after close = %v", err)
	}
	lock.Close()
}

// A data directory whose log holds records the bbolt file does not (a
// log-first run that crashed) is refused by the bbolt engine, which would
// serve the file without them, and served whole by the log engine.
func TestOpenDataDir_BoltRefusesALogWithPendingRecords(t *testing.T) {
	dir := crashedLogDir(t)
	if d, err := openDataDir(dir, Config{Engine: EngineBolt}, zerolog.Nop()); !errors.Is(err, ErrLogPending) {
		if err == nil {
			d.Close()
		}
		t.Fatalf("openDataDir(bbolt) = %v, want ErrLogPending", err)
	}
	d, err := openDataDir(dir, Config{Engine: EngineLog}, zerolog.Nop())
	if err != nil {
		t.Fatalf("openDataDir(log) = %v", err)
	}
	got, err := d.st.ReadFrom("s", 0, 0)
	if err != nil || len(got) != 1 || string(got[0].Payload) != "acknowledged" {
		t.Fatalf("ReadFrom on the log engine = %v, %v", got, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Closed cleanly, the log is checkpointed: bbolt serves it whole.
	d, err = openDataDir(dir, Config{Engine: EngineBolt}, zerolog.Nop())
	if err != nil {
		t.Fatalf("openDataDir(bbolt) after a clean log run = %v", err)
	}
	got, err = d.st.ReadFrom("s", 0, 0)
	if err != nil || len(got) != 1 {
		t.Fatalf("ReadFrom on bbolt = %v, %v", got, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// A data directory whose log was made durable and then lost (wal/ gone)
// is refused by both engines: the log engine would start a new log over
// the loss, the bbolt engine would serve the file without the lost writes.
func TestOpenDataDir_BothEnginesRefuseALostLog(t *testing.T) {
	dir := crashedLogDir(t)
	if err := os.RemoveAll(filepath.Join(dir, logfirst.WALDir)); err != nil {
		t.Fatal(err)
	}
	for _, engine := range []string{EngineLog, EngineBolt} {
		d, err := openDataDir(dir, Config{Engine: engine}, zerolog.Nop())
		if err == nil {
			d.Close()
		}
		if !errors.Is(err, logfirst.ErrLogLost) {
			t.Errorf("openDataDir(%s) on a lost log = %v, want logfirst.ErrLogLost", engine, err)
		}
	}
}

// crashedLogDir returns a data directory as a crash of the log engine
// leaves it: one record, "acknowledged" in stream "s", durable in the log
// and not checkpointed into the bbolt file. It is a copy of the files
// taken while the store is open.
func crashedLogDir(t *testing.T) string {
	t.Helper()
	src, dir := t.TempDir(), t.TempDir()
	st, err := logfirst.Open(src, logfirst.Options{CheckpointInterval: time.Hour, CheckpointBytes: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Append("s", []byte("acknowledged"), 0); err != nil {
		t.Fatal(err)
	}
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	copyTree(t, src, dir)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		if e.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), raw, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
