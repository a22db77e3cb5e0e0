package e2e_test

import (
	"bytes"
	"crypto/rand"
	"flag"
	"fmt"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/participantd/participantd/offline"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/wire"
)

// The release soak (make soak, docs/operations.md "Release soak"):
//
//	go test ./cmd/participantd/e2e -run TestSoak_ -soak-rounds 1000 -soak-rows 100000 -timeout 0 -v
//
// Without flags it runs a few rounds as part of the (non -short) e2e tests.
var (
	soakRounds = flag.Int("soak-rounds", 5, "SIGKILL rounds of TestSoak_AnsweredSurviveKills (1000 for a release)")
	soakRows   = flag.Int("soak-rows", 2000, "tells answered over the soak, at least: the conversation's history grows past it")
	soakSample = flag.Int("soak-sample", 0, "tells of earlier rounds replayed after each restart, besides all of the killed round's and all of them after the last round (0: every answered tell after every restart)")
)

// soakConv is the conversation whose history the soak grows.
const soakConv = 91

// attachRec is an answered attach: the request (its token and the
// credential it presented) and the credential it was answered.
type attachRec struct {
	tok  wire.Token
	from cred
	got  cred
}

// soak drives participantd through rounds of load, SIGKILL and restart.
// Participant 0 tells; 1 and 2 receive. Only the test goroutine touches it.
type soak struct {
	t        *testing.T
	bin, dir string
	p        *proc
	conns    [3]*client
	creds    [3]cred
	enrolls  [3]wire.Token
	last     [3]attachRec // the latest answered attach of each participant
	attached [3]bool      // last is set
	cursors  [3]uint64
	tells    []answered // every tell answered, in all rounds

	kills, moves, tellReplays, attachReplays int
}

func attachMsg(id uint64, from cred, tok wire.Token) wire.Message {
	return &wire.Attach{ID: id, Conversation: from.conv, Participant: from.p, Generation: from.gen, Secret: from.secret, Token: tok}
}

// attach binds participant i to c with a fresh token, and checks that the
// attach it superseded now replays as receipt_expired/superseded.
func (s *soak) attach(i int, c *client) {
	s.t.Helper()
	tok, from := token(), s.creds[i]
	m := c.call(func(id uint64) wire.Message { return attachMsg(id, from, tok) })
	a, ok := m.(*wire.Attached)
	if !ok || a.Replay != nil || a.Generation != from.gen+1 {
		s.t.Fatalf("attach of participant %d (generation %d) answered %#v", from.p, from.gen, m)
	}
	prev, hadPrev := s.last[i], s.attached[i]
	s.creds[i] = cred{from.conv, a.Participant, a.Generation, a.Secret}
	s.last[i], s.attached[i] = attachRec{tok, from, s.creds[i]}, true
	s.conns[i] = c
	if hadPrev {
		m := c.call(func(id uint64) wire.Message { return attachMsg(id, prev.from, prev.tok) })
		e, ok := m.(*wire.Error)
		if !ok || e.Code != wire.CodeReceiptExpired || e.Reason == nil || *e.Reason != wire.ExpiredSuperseded {
			s.t.Fatalf("retry of a superseded attach of participant %d answered %#v", from.p, m)
		}
		s.attachReplays++
	}
}

// replayLastAttach retries participant i's latest attach on c, after a
// restart ended its binding: the original credential, replay unbound.
func (s *soak) replayLastAttach(i int, c *client) {
	s.t.Helper()
	r := s.last[i]
	m := c.call(func(id uint64) wire.Message { return attachMsg(id, r.from, r.tok) })
	a, ok := m.(*wire.Attached)
	if !ok || a.Generation != r.got.gen || a.Secret != r.got.secret || a.Replay == nil || *a.Replay != wire.ReplayUnbound {
		s.t.Fatalf("retry of the last attach of participant %d (generation %d) after a restart answered %#v", r.got.p, r.got.gen, m)
	}
	s.attachReplays++
}

// load pipelines tells from participant 0 until the server is killed:
// after target tells are answered, at a random moment within 20ms. When
// move is set, participant move (a receiver) attaches on a new connection
// once half the target is answered, under the load. It returns the tells
// answered before the kill.
func (s *soak) load(round, target, move int) []answered {
	t := s.t
	a, ca := s.conns[0], s.creds[0]
	var mu sync.Mutex
	var got []answered
	var count atomic.Int64
	half, full := make(chan struct{}), make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		payload := func(n int, tok wire.Token) []byte { return fmt.Appendf(nil, "soak r%d n%d %x", round, n, tok[:4]) }
		a.tellUntil(ca, payload, stop, func(r answered) {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
			n := count.Add(1)
			if n == int64(max(target/2, 1)) {
				close(half)
			}
			if n == int64(target) {
				close(full)
			}
		})
	}()
	wait := func(ch chan struct{}, what string) {
		select {
		case <-ch:
		case <-time.After(waitFor):
			t.Fatalf("round %d: %s of %d tells not answered in %v (%d were)", round, what, target, waitFor, count.Load())
		}
	}
	wait(half, "half")
	if move > 0 {
		old := s.conns[move]
		s.attach(move, dial(t, s.p.addr))
		s.moves++
		old.conn.Close()
		<-old.closed
		old.dl = nil // its reader is gone: free the buffer
	}
	wait(full, "all")
	delay, _ := rand.Int(rand.Reader, big.NewInt(20))
	time.Sleep(time.Duration(delay.Int64()) * time.Millisecond) // the random kill moment, not a synchronization
	s.p.kill(t)
	s.kills++
	close(stop)
	wg.Wait()
	for _, c := range s.conns {
		<-c.closed
		c.dl = nil
	}
	return got
}

// receive reads participant i's deliveries until it was delivered every
// record of want (seq to payload) with its payload and, when died is set,
// the died/unclean_restart of each participant in it; it then acknowledges
// the highest seq it was delivered.
func (s *soak) receive(round, i int, want map[uint64][]byte, died map[uint64]bool) {
	s.t.Helper()
	c, cr := s.conns[i], s.creds[i]
	want = maps.Clone(want)
	died = maps.Clone(died)
	maxSeq := s.cursors[i]
	for len(want) > 0 || len(died) > 0 {
		select {
		case d := <-c.dl:
			maxSeq = max(maxSeq, d.Seq)
			switch {
			case d.Kind == wire.KindRecord:
				if w, ok := want[d.Seq]; ok {
					if !bytes.Equal(d.Payload, w) {
						s.t.Fatalf("round %d: participant %d was delivered seq %d as %q, told %q", round, cr.p, d.Seq, d.Payload, w)
					}
					delete(want, d.Seq)
				}
			case d.Kind == wire.KindDied && d.Cause != nil && *d.Cause == wire.CauseUncleanRestart:
				delete(died, d.Participant)
			}
		case <-time.After(waitFor):
			s.t.Fatalf("round %d: participant %d still misses %d answered tells and %d died/unclean_restart", round, cr.p, len(want), len(died))
		}
	}
	if maxSeq == s.cursors[i] {
		return
	}
	m := c.call(func(id uint64) wire.Message {
		return &wire.Ack{ID: id, Conversation: soakConv, Participant: cr.p, Generation: cr.gen, Through: maxSeq}
	})
	if a, ok := m.(*wire.Acked); !ok || a.Cursor != maxSeq {
		s.t.Fatalf("round %d: ack of participant %d through %d answered %#v", round, cr.p, maxSeq, m)
	}
	s.cursors[i] = maxSeq
}

// TestSoak_AnsweredSurviveKills is the release soak: the binary, with
// checkpoints and compaction running all the time, is SIGKILLed in every
// round at a random moment of a pipelined tell load into one conversation
// whose history grows past -soak-rows; in one round of three a receiver
// attaches on a new connection under the load. After every restart:
// each participant's last attach replays its credential (unbound), then a
// new attach makes it replay as receipt_expired/superseded; the tells are
// retried with their tokens and must answer their original seq (all of
// them, or with -soak-sample the killed round's and a sample of the older,
// and all of them after the last round); both receivers are delivered
// every tell answered in the killed round with its payload, and the teller
// each receiver's died/unclean_restart. At the end the server drains on
// SIGTERM, and the conversation's history was compacted on the way and
// holds every answered tell.
func TestSoak_AnsweredSurviveKills(t *testing.T) {
	rounds, rows := *soakRounds, *soakRows
	if rounds < 1 || rows < rounds {
		t.Fatalf("-soak-rounds %d -soak-rows %d: want at least one round and a tell a round", rounds, rows)
	}
	target := (rows + rounds - 1) / rounds
	if target > 30000 {
		t.Fatalf("%d tells a round: more than half the default --max-backlog-records; raise -soak-rounds", target)
	}
	began := time.Now()
	s := &soak{t: t, bin: buildBinary(t), dir: t.TempDir()}
	s.p = startProc(t, s.bin, s.dir)
	for i := range s.conns {
		c := dial(t, s.p.addr)
		tok := token()
		m := c.call(func(id uint64) wire.Message { return &wire.Enroll{ID: id, Conversation: soakConv, Token: tok} })
		e, ok := m.(*wire.Enrolled)
		if !ok {
			t.Fatalf("enroll answered %#v", m)
		}
		s.conns[i], s.creds[i], s.enrolls[i] = c, cred{soakConv, e.Participant, e.Generation, e.Secret}, tok
	}

	for round := range rounds {
		move := 0
		if round%3 == 1 {
			move = 1 + round/3%2
		}
		got := s.load(round, target, move)
		s.tells = append(s.tells, got...)
		if round%10 == 0 || round == rounds-1 {
			s.inspectCrashed(round)
		}

		s.p = startProc(t, s.bin, s.dir)
		for i := range s.conns {
			c := dial(t, s.p.addr)
			if s.attached[i] {
				s.replayLastAttach(i, c)
			}
			s.attach(i, c)
		}
		replay := s.tells
		if *soakSample > 0 && round < rounds-1 {
			replay = append([]answered(nil), got...)
			older := s.tells[:len(s.tells)-len(got)]
			for range min(*soakSample, len(older)) {
				k, _ := rand.Int(rand.Reader, big.NewInt(int64(len(older))))
				replay = append(replay, older[k.Int64()])
			}
		}
		s.checkReplays(round, replay)

		want := make(map[uint64][]byte, len(got))
		for _, r := range got {
			want[r.seq] = r.payload
		}
		s.receive(round, 1, want, nil)
		s.receive(round, 2, want, nil)
		s.receive(round, 0, nil, map[uint64]bool{s.creds[1].p: true, s.creds[2].p: true})
		if round%50 == 49 || round == rounds-1 {
			t.Logf("round %d: %d tells answered so far, %d replayed, %d kills, %d moves, %v", round+1, len(s.tells), s.tellReplays, s.kills, s.moves, time.Since(began).Round(time.Second))
		}
	}
	// Every enroll was superseded by an attach long ago.
	for i, tok := range s.enrolls {
		m := s.conns[i].call(func(id uint64) wire.Message { return &wire.Enroll{ID: id, Conversation: soakConv, Token: tok} })
		if e, ok := m.(*wire.Error); !ok || e.Code != wire.CodeReceiptExpired || e.Reason == nil || *e.Reason != wire.ExpiredSuperseded {
			t.Fatalf("retry of participant %d's enroll answered %#v", s.creds[i].p, m)
		}
	}

	s.p.cmd.Process.Signal(syscall.SIGTERM)
	if err := s.p.cmd.Wait(); err != nil {
		t.Fatalf("participantd after SIGTERM: %v; stderr:\n%s", err, s.p.stderr)
	}
	checkLogs(t, s.p.stderr)
	st, err := boltstore.Open(filepath.Join(s.dir, "participantd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	first, err := st.First(oplog.Stream(soakConv))
	if err != nil || first == 0 {
		t.Errorf("oplog of %d starts at row %d (%v): nothing was compacted during the soak", soakConv, first, err)
	}
	n, err := st.Len(oplog.Stream(soakConv))
	if err != nil || n < uint64(len(s.tells)) {
		t.Errorf("oplog of %d has %d rows (%v), fewer than the %d tells answered", soakConv, n, err, len(s.tells))
	}
	t.Logf("soak: %d rounds, %d SIGKILLs, %d moves; %d tells answered, conversation history %d rows (compacted below %d); %d tell replays and %d attach replays checked; %v",
		rounds, s.kills, s.moves, len(s.tells), n, first, s.tellReplays, s.attachReplays, time.Since(began).Round(time.Second))
}

// inspectCrashed runs participantctl's inspect (offline.Inspect) on the
// data directory the kill left, as an operator would before the restart:
// it must change no byte of the data file, refuse nothing, and find every
// tell answered so far (the restart's checks follow it).
func (s *soak) inspectCrashed(round int) {
	s.t.Helper()
	file := filepath.Join(s.dir, offline.StoreFile)
	before, err := os.ReadFile(file)
	if err != nil {
		s.t.Fatal(err)
	}
	_, reports, err := offline.Inspect(s.dir, offline.Options{})
	if err != nil {
		s.t.Fatalf("round %d: inspect of the killed server's directory: %v", round, err)
	}
	if after, err := os.ReadFile(file); err != nil || !bytes.Equal(before, after) {
		s.t.Fatalf("round %d: inspect of the killed server's directory changed its data file (%v)", round, err)
	}
	var last uint64
	for _, r := range s.tells {
		last = max(last, r.seq)
	}
	for _, r := range reports {
		if r.Conversation != soakConv {
			continue
		}
		if r.Refused != nil || uint64(r.LastSeq) < last {
			s.t.Fatalf("round %d: inspect of the killed server's directory reports conversation %d refused %v, last seq %d; want seq %d answered", round, soakConv, r.Refused, r.LastSeq, last)
		}
		return
	}
	s.t.Fatalf("round %d: inspect of the killed server's directory reports no conversation %d", round, soakConv)
}

// checkReplays retries each tell of rs with its token and payload on the
// teller's connection: each must answer its original seq, as a replay.
func (s *soak) checkReplays(round int, rs []answered) {
	s.t.Helper()
	a, ca := s.conns[0], s.creds[0]
	k := 0
	a.pipeline(len(rs), 256, func(i int, id uint64) wire.Message {
		r := rs[i]
		return &wire.Tell{ID: id, Conversation: soakConv, Participant: ca.p, Generation: r.gen, Token: r.tok, Payload: r.payload}
	}, func(m wire.Message) {
		r := rs[k]
		k++
		told, ok := m.(*wire.Told)
		if !ok || told.Seq != r.seq || told.Replay == nil || *told.Replay != wire.ReplayCommitted {
			s.t.Fatalf("round %d: retry of tell seq %d (%q) answered %#v", round, r.seq, r.payload, m)
		}
	})
	s.tellReplays += len(rs)
}
