package server

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/store/logfirst"
)

// A data directory whose log was made durable and then lost (wal/ gone)
// is refused by both engines: the log engine would start a new log over
// the loss, the bbolt engine would serve the file without the lost writes.
func TestOpenDataDir_BothEnginesRefuseALostLog(t *testing.T) {
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
	// A copy of the files while the store is open is what a crash leaves.
	copyTree(t, src, dir)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
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
