package participant

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/store/vfs"
)

// logBytesFS counts the bytes written to the log's segments.
type logBytesFS struct {
	vfs.FS
	n atomic.Int64
}

type logBytesFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *logBytesFS) wrap(name string, file vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.Contains(name, string(filepath.Separator)+logfirst.WALDir+string(filepath.Separator)) {
		return file, err
	}
	return logBytesFile{file, &f.n}, nil
}

func (f *logBytesFS) Create(name string) (vfs.File, error) {
	file, err := f.FS.Create(name)
	return f.wrap(name, file, err)
}

func (f *logBytesFS) OpenRW(name string) (vfs.File, error) {
	file, err := f.FS.OpenRW(name)
	return f.wrap(name, file, err)
}

func (f logBytesFile) WriteAt(p []byte, off int64) (int, error) {
	f.n.Add(int64(len(p)))
	return f.File.WriteAt(p, off)
}

// BenchmarkCommit_TellLogBytes runs durable tells of 200 bytes on the
// log-first store, one writer and 32 per core on distinct conversations, and
// reports the bytes written to the log per tell (log-B/tell: records,
// their framing and stamps, segment headers) and the log's records per
// tell, the figures a change of the log's record format moves.
func BenchmarkCommit_TellLogBytes(b *testing.B) {
	payload := make([]byte, 200)
	for _, p := range []int{0, 32} {
		name := "writers=1"
		if p > 0 {
			name = fmt.Sprintf("parallelism=%d", p)
		}
		b.Run(name, func(b *testing.B) {
			fsys := &logBytesFS{FS: vfs.OS}
			st, err := logfirst.Open(filepath.Join(b.TempDir(), "data"), logfirst.Options{FS: fsys, CheckpointInterval: time.Hour, CheckpointBytes: 1 << 40})
			if err != nil {
				b.Fatal(err)
			}
			svc, err := Open(context.Background(), st, Options{NodeKey: testKey})
			if err != nil {
				st.Close()
				b.Fatal(err)
			}
			defer func() {
				svc.Close()
				st.Close()
			}()
			var next atomic.Uint64
			var ws []*benchWriter
			// RunParallel's goroutines, a writer each.
			for range max(1, p*runtime.GOMAXPROCS(0)) {
				w, err := newBenchWriter(svc, next.Add(1))
				if err != nil {
					b.Fatal(err)
				}
				ws = append(ws, w)
			}
			bytes0, commits0 := fsys.n.Load(), st.Stats().Commits
			var tells atomic.Int64
			if p == 0 {
				for b.Loop() {
					if err := ws[0].tell(payload); err != nil {
						b.Fatal(err)
					}
					tells.Add(1)
				}
			} else {
				var i atomic.Int64
				b.SetParallelism(p)
				b.RunParallel(func(pb *testing.PB) {
					w := ws[int(i.Add(1)-1)%len(ws)]
					for pb.Next() {
						if err := w.tell(payload); err != nil {
							b.Errorf("Tell: %v", err)
							return
						}
						tells.Add(1)
					}
				})
			}
			n := float64(tells.Load())
			b.ReportMetric(float64(fsys.n.Load()-bytes0)/n, "log-B/tell")
			b.ReportMetric(float64(st.Stats().Commits-commits0)/n, "records/tell")
		})
	}
}
