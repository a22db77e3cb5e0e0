package server

import (
	"testing"
	"time"

	"github.com/participantd/participantd/participant"
)

// BenchmarkStageMetrics_PerRequest is what the stage metrics cost a
// request: its stages observed when answered, and its write and whole
// when written.
func BenchmarkStageMetrics_PerRequest(b *testing.B) {
	m := newStageMetrics()
	read := time.Now()
	started := read.Add(time.Microsecond)
	queued := started.Add(5 * time.Millisecond)
	st := participant.Stages{Turn: time.Millisecond, Decide: 50 * time.Microsecond, CommitWait: time.Millisecond,
		Commit: 2 * time.Millisecond, Publish: 30 * time.Microsecond, Done: queued.Add(-time.Microsecond), Barriers: true}
	written := queued.Add(100 * time.Microsecond)
	b.ReportAllocs()
	for b.Loop() {
		m.answered(opTell, read, started, queued, st)
		m.by[opTell].written(read, queued, written)
	}
}
