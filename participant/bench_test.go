package participant

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/store/boltstore"
)

// The commit path of the service without a network: each operation runs
// both barriers on a bbolt store in b.TempDir(), so the figures include the
// fsyncs. commits/op is the store's Stats().Commits per operation: 2 means
// no group commit at all (each operation pays both of its barriers alone),
// less than 2 means operations of different conversations shared commits.

// benchToken returns a token unique to (writer, n), never all zero.
func benchToken(writer, n uint64) Token {
	var t Token
	binary.BigEndian.PutUint64(t[:8], writer+1)
	binary.BigEndian.PutUint64(t[8:], n)
	return t
}

// openBenchService opens a service on a fresh bbolt store.
func openBenchService(b *testing.B) (*Service, *boltstore.Store) {
	b.Helper()
	st, err := boltstore.Open(filepath.Join(b.TempDir(), "data.db"), boltstore.Options{})
	if err != nil {
		b.Fatalf("boltstore.Open: %v", err)
	}
	svc, err := Open(context.Background(), st, Options{NodeKey: testKey})
	if err != nil {
		st.Close()
		b.Fatalf("Open: %v", err)
	}
	b.Cleanup(func() {
		svc.Close()
		st.Close()
	})
	return svc, st
}

// benchWriter is one conversation with a sender and a recipient, each on its
// own connection, as two clients of the protocol would be.
type benchWriter struct {
	id     uint64
	conv   ConversationID
	sender *Conn
	p      ParticipantID
	gen    Generation
	n      uint64
}

// newBenchWriter enrolls the sender and the recipient. It returns an error
// rather than failing b, since RunParallel's goroutines must not call Fatal.
func newBenchWriter(svc *Service, id uint64) (*benchWriter, error) {
	ctx := context.Background()
	w := &benchWriter{id: id, conv: ConversationID(1000 + id), sender: svc.Connect(nil)}
	bd, err := w.sender.Enroll(ctx, Enroll{Conversation: w.conv, Token: benchToken(id, 1<<62)})
	if err != nil {
		return nil, fmt.Errorf("Enroll(sender, conversation=%v): %w", w.conv, err)
	}
	w.p, w.gen = bd.Participant, bd.Generation
	if _, err := svc.Connect(nil).Enroll(ctx, Enroll{Conversation: w.conv, Token: benchToken(id, 1<<62+1)}); err != nil {
		return nil, fmt.Errorf("Enroll(recipient, conversation=%v): %w", w.conv, err)
	}
	return w, nil
}

func (w *benchWriter) tell(payload []byte) error {
	w.n++
	_, err := w.sender.Tell(context.Background(), Tell{
		Conversation: w.conv, Participant: w.p, Generation: w.gen,
		Token: benchToken(w.id, w.n), Payload: payload,
	})
	return err
}

// BenchmarkCommit_Tell measures durable tells: one writer alone, then
// writers on distinct conversations in parallel (b.RunParallel with
// SetParallelism, so 2×GOMAXPROCS×p goroutines on a 2-core machine is 64 at
// p=32), which is where group commit must show as commits/op well below 2.
func BenchmarkCommit_Tell(b *testing.B) {
	payload := make([]byte, 200)
	b.Run("writers=1", func(b *testing.B) {
		svc, st := openBenchService(b)
		w, err := newBenchWriter(svc, 0)
		if err != nil {
			b.Fatal(err)
		}
		before := st.Stats().Commits
		start := time.Now()
		for b.Loop() {
			if err := w.tell(payload); err != nil {
				b.Fatalf("Tell: %v", err)
			}
		}
		reportCommit(b, st, before, time.Since(start))
	})
	for _, p := range []int{4, 32} {
		b.Run(fmt.Sprintf("parallelism=%d", p), func(b *testing.B) {
			svc, st := openBenchService(b)
			var next atomic.Uint64
			b.SetParallelism(p)
			before := st.Stats().Commits
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				w, err := newBenchWriter(svc, next.Add(1))
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					if err := w.tell(payload); err != nil {
						b.Errorf("Tell: %v", err)
						return
					}
				}
			})
			reportCommit(b, st, before, time.Since(start))
		})
	}
}

// BenchmarkCommit_Enroll measures enrollments, each into a new conversation
// (registry append, genesis and the enroll row), in parallel.
func BenchmarkCommit_Enroll(b *testing.B) {
	for _, p := range []int{1, 32} {
		b.Run(fmt.Sprintf("parallelism=%d", p), func(b *testing.B) {
			svc, st := openBenchService(b)
			var next atomic.Uint64
			b.SetParallelism(p)
			before := st.Stats().Commits
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					n := next.Add(1)
					c := svc.Connect(nil)
					if _, err := c.Enroll(ctx, Enroll{Conversation: ConversationID(n), Token: benchToken(n, 0)}); err != nil {
						b.Errorf("Enroll(conversation=%d): %v", n, err)
						return
					}
				}
			})
			reportCommit(b, st, before, time.Since(start))
		})
	}
}

// reportCommit reports ops/s and commits/op since before.
func reportCommit(b *testing.B, st *boltstore.Store, before uint64, elapsed time.Duration) {
	b.Helper()
	if elapsed <= 0 || b.N == 0 {
		return
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(st.Stats().Commits-before)/float64(b.N), "commits/op")
}
