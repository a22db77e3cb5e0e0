package server_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/server"
)

// lockedBuffer is a log sink many goroutines write to.
type lockedBuffer struct {
	mu sync.Mutex
	// +checklocks:mu
	b bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestLogging_DebugLogsEachRequest(t *testing.T) {
	for _, level := range []zerolog.Level{zerolog.InfoLevel, zerolog.DebugLevel} {
		var buf lockedBuffer
		h := start(t, server.Config{Logger: zerolog.New(&buf).Level(level)})
		c := h.dial()
		cr := c.enroll(5)
		c.tell(cr, "x")
		h.shutdown()
		var requests []string
		for _, l := range buf.lines() {
			if l["message"] != "request" {
				continue
			}
			requests = append(requests, l["request"].(string)+"->"+l["answer"].(string))
			if _, ok := l["duration_ms"].(float64); !ok {
				t.Errorf("request log %v has no numeric duration_ms", l)
			}
		}
		want := 0
		if level == zerolog.DebugLevel {
			want = 2
		}
		if len(requests) != want || (want == 2 && strings.Join(requests, " ") != "enroll->enrolled tell->told") {
			t.Errorf("at level %v, request logs = %v, want %d (enroll->enrolled, tell->told)", level, requests, want)
		}
		for _, l := range buf.lines() {
			for k := range l {
				if k == "duration" || k == "took" {
					t.Errorf("log %v has a duration field without its unit: %s", l, k)
				}
			}
		}
	}
}
