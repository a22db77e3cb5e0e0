package main

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/server"
	"github.com/participantd/participantd/wire"
)

func TestSpread(t *testing.T) {
	pairs := func(n int) []int { // the tell shape's default: n/2 conversations of two
		c := make([]int, n)
		for i := range c {
			c[i] = i % (n / 2)
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		convOf []int
		k      int
		want   []int
	}{
		{"one each is the identity", pairs(8), 8, []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"two members over two", pairs(8), 2, []int{0, 1, 0, 1, 1, 0, 1, 0}},
		{"two members over four", pairs(8), 4, []int{0, 1, 2, 3, 1, 2, 3, 0}},
		{"one member each over one", []int{0, 1, 2, 3}, 1, []int{0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := spread(tc.convOf, tc.k)
			if err != nil {
				t.Fatalf("spread(%v, %d) = %v", tc.convOf, tc.k, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("spread(%v, %d) (-want +got):\n%s", tc.convOf, tc.k, diff)
			}
		})
	}
	if got, err := spread(pairs(8), 1); !errors.Is(err, errConnsTooFew) {
		t.Fatalf("spread(pairs, 1) = %v, %v; want errConnsTooFew", got, err)
	}
}

// spread never puts two members of one conversation on one connection,
// and loads the connections evenly, for the bench's shapes.
func TestSpread_OneBindingPerConversationAndEvenLoad(t *testing.T) {
	for _, n := range []int{4, 64, 100} {
		for _, convs := range []int{n / 2, n / 4, n} {
			convOf := make([]int, n)
			members := 0
			for i := range convOf {
				convOf[i] = i % convs
				members = max(members, i/convs+1)
			}
			for k := members; k <= n; k *= 2 {
				place, err := spread(convOf, k)
				if err != nil {
					t.Fatalf("n %d, convs %d, k %d: %v", n, convs, k, err)
				}
				held := map[[2]int]bool{}
				load := make([]int, k)
				for i, j := range place {
					key := [2]int{j, convOf[i]}
					if held[key] {
						t.Fatalf("n %d, convs %d, k %d: connection %d holds two members of conversation %d", n, convs, k, j, convOf[i])
					}
					held[key] = true
					load[j]++
				}
				lo, hi := n, 0
				for _, l := range load {
					lo, hi = min(lo, l), max(hi, l)
				}
				if hi-lo > 1 {
					t.Fatalf("n %d, convs %d, k %d: connections carry %v participants; want even", n, convs, k, load)
				}
			}
		}
	}
}

// The demux hands each delivery to the worker bound in its conversation
// on the connection, and counts as an error one for another recipient or
// for a conversation the connection is not bound in.
func TestDemux_DeliversToTheParticipantOfTheConversation(t *testing.T) {
	newWorker := func(conv, p uint64) *worker {
		w := &worker{run: &loadRun{}, conv: conv, nudge: make(chan struct{}, 1)}
		w.bound.Store(p)
		return w
	}
	a, b := newWorker(10, 1), newWorker(20, 7)
	m := &demux{byConv: map[uint64]*worker{10: a, 20: b}, first: a}
	m.deliver(&wire.Delivery{Conversation: 10, Recipient: 1, Seq: 5, Kind: wire.KindRecord})
	m.deliver(&wire.Delivery{Conversation: 20, Recipient: 7, Seq: 3, Kind: wire.KindRecord})
	m.deliver(&wire.Delivery{Conversation: 20, Recipient: 7, Seq: 2, Kind: wire.KindRecord}) // older: no regression
	if a.maxSeen.Load() != 5 || b.maxSeen.Load() != 3 || a.errCount.Load() != 0 || b.errCount.Load() != 0 {
		t.Fatalf("after three good deliveries: a saw %d (%d errors), b saw %d (%d errors); want 5, 3 and none",
			a.maxSeen.Load(), a.errCount.Load(), b.maxSeen.Load(), b.errCount.Load())
	}
	m.deliver(&wire.Delivery{Conversation: 20, Recipient: 1, Seq: 9, Kind: wire.KindRecord})
	if b.maxSeen.Load() != 3 || b.errCount.Load() != 1 {
		t.Fatalf("delivery for recipient 1 in b's conversation: b saw %d, %d errors; want 3 and one error", b.maxSeen.Load(), b.errCount.Load())
	}
	m.deliver(&wire.Delivery{Conversation: 30, Recipient: 1, Seq: 9, Kind: wire.KindRecord})
	if a.maxSeen.Load() != 5 || a.errCount.Load() != 1 {
		t.Fatalf("delivery of an unbound conversation: a saw %d, %d errors; want 5 and one error", a.maxSeen.Load(), a.errCount.Load())
	}
}

// Against a server: participants sharing two connections each receive
// their conversation's deliveries and ack them cumulatively as their own
// binding (the server refuses an ack from another binding, or through a
// seq not addressed to the participant: ack_gap); after the run, each
// participant's ack through the highest seq it saw is accepted, and every
// counted answer replays.
func TestBench_SharedConnections_DeliversAndAcksPerParticipant(t *testing.T) {
	ctx := context.Background()
	srv, stop, err := startEmbedded(ctx, server.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, window := range []int{1, 4} {
		f := &benchFlags{duration: 500 * time.Millisecond, warmup: 50 * time.Millisecond, load: loadConfig{addr: srv.Addr().String(), op: opTell,
			clients: 8, conns: 2, payload: 10, window: window, enrollPerConn: 8, verify: 40, coalesce: true}}
		rep := &benchReport{}
		r, err := runLoadOf(ctx, f, rep, io.Discard)
		if r != nil {
			defer r.close()
		}
		if err != nil {
			t.Fatal(err)
		}
		if rep.Conns != 2 || rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 || rep.Acks == 0 {
			t.Fatalf("window %d: report = %d connections, ops %d, errors %d (%s), verified %d, failures %v, acks %d; want 2 connections, ops, no errors, replays verified, acks",
				window, rep.Conns, rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures, rep.Acks)
		}
		conns := map[*benchConn]int{}
		for _, w := range r.workers {
			conns[w.conn]++
			through := w.maxSeen.Load()
			if through == 0 || w.count.Load() == 0 {
				t.Fatalf("window %d: participant %d counted %d tells and saw deliveries through %d; want both", window, w.p, w.count.Load(), through)
			}
			m, err := w.conn.call(ctx, &wire.Ack{Conversation: w.conv, Participant: w.p, Generation: w.gen, Through: through})
			if _, ok := m.(*wire.Acked); err != nil || !ok {
				t.Fatalf("window %d: participant %d ack through %d = %v, %v; want acked", window, w.p, through, m, err)
			}
		}
		if len(conns) != 2 || conns[r.conns[0]] != 4 || conns[r.conns[1]] != 4 {
			t.Fatalf("window %d: participants per connection %v; want 4 on each of 2", window, conns)
		}
	}
}

func TestBench_ConnsRefusesWhatTheProtocolCannotCarry(t *testing.T) {
	for _, args := range [][]string{
		{"--embedded", "--clients", "4", "--conns", "1"},                   // two members a conversation
		{"--embedded", "--clients", "4", "--conns", "5"},                   // more connections than clients
		{"--embedded", "--clients", "4", "--conns", "2", "--op", opEnroll}, // enroll reconnects
		{"--embedded", "--clients", "4", "--conns", "2", "--op", opMixed},
		{"--embedded", "--clients", "4", "--conns", "-1"},
	} {
		if _, errs, code := runForTest(args...); code != 2 {
			t.Errorf("%v = exit %d (%s), want 2", args, code, errs)
		}
	}
	// One member a conversation fits on one connection.
	rep := runBenchForTest(t, "--embedded", "--data-dir", t.TempDir(), "--clients", "4", "--conversations", "4", "--conns", "1",
		"--window", "2", "--duration", "300ms", "--warmup", "50ms", "--fsync-probe=false", "--verify", "10")
	if rep.Conns != 1 || rep.Ops == 0 || rep.Errors != 0 || len(rep.VerifyFailures) != 0 || rep.Verified == 0 {
		t.Fatalf("report = %d connections, ops %d, errors %d (%s), verified %d, failures %v; want one connection, ops, no errors, verified",
			rep.Conns, rep.Ops, rep.Errors, rep.FirstError, rep.Verified, rep.VerifyFailures)
	}
}
