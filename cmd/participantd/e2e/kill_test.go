package e2e_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/participantd/participantd/internal/daemontest"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/store/boltstore"
	"github.com/participantd/participantd/wire"
)

const waitFor = 15 * time.Second

// proc is one run of the participantd binary.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	health string
	stderr *bytes.Buffer
}

// buildBinary builds participantd with the given build tags (faulthook:
// the test hook of cmd/participantd/faulthook.go).
func buildBinary(t *testing.T, tags ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped under -short")
	}
	bin, err := daemontest.Build(t.TempDir(), tags...)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// startProc runs the binary on dir and waits for /ready; env, NAME=value
// settings, override the defaults below. A port that FreeAddr found free
// can be taken by another process before the binary binds it (the machine
// is shared): the binary then exits, and startProc starts it again on new
// ports, a few times.
func startProc(t *testing.T, bin, dir string, env ...string) *proc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p, err := tryStartProc(t, bin, dir, env...)
		if err == nil {
			return p
		}
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if attempt == 3 || !strings.Contains(p.stderr.String(), "address already in use") {
			t.Fatalf("participantd: %v; stderr:\n%s", err, p.stderr)
		}
		t.Logf("participantd: a port was taken before it bound it; again on new ports: %s", p.stderr)
	}
}

// tryStartProc is one attempt of startProc: the error is WaitReady's, and
// the process may still run.
func tryStartProc(t *testing.T, bin, dir string, env ...string) (*proc, error) {
	t.Helper()
	p := &proc{addr: daemontest.FreeAddr(t), health: daemontest.FreeAddr(t), stderr: new(bytes.Buffer)}
	p.cmd = exec.Command(bin, "--data", dir, "--listen", p.addr, "--health-listen", p.health, "--log-level", "warn")
	// Checkpoints and compaction run all the time, so that kills land in
	// their writes too.
	p.cmd.Env = append(os.Environ(), "PARTICIPANTD_DRAIN_TIMEOUT=5s",
		"PARTICIPANTD_CHECKPOINT_INTERVAL=10ms", "PARTICIPANTD_CHECKPOINT_ROWS=64", "PARTICIPANTD_RETAIN=1ms")
	p.cmd.Env = append(p.cmd.Env, env...) // the last of duplicates wins
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	return p, daemontest.WaitReady(p.health, nil, waitFor)
}

func (p *proc) kill(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

// client is a raw wire client: a reader goroutine sorts answers by id and
// collects deliveries.
type client struct {
	t      *testing.T
	conn   *wire.Conn
	mu     sync.Mutex
	nextID uint64
	// waiting maps request ids to their answer channel.
	waiting map[uint64]chan wire.Message
	dl      chan *wire.Delivery
	closed  chan struct{}
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, conn: wire.NewConn(nc, wire.ConnOptions{}), waiting: make(map[uint64]chan wire.Message),
		dl: make(chan *wire.Delivery, 1<<20), closed: make(chan struct{})}
	if err := c.conn.WriteMessage(&wire.Hello{Versions: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	m, err := c.conn.ReadServerMessage()
	if _, ok := m.(*wire.Welcome); !ok {
		t.Fatalf("hello answered %#v, %v", m, err)
	}
	go c.read()
	t.Cleanup(func() { c.conn.Close(); <-c.closed })
	return c
}

func (c *client) read() {
	defer close(c.closed)
	for {
		m, err := c.conn.ReadServerMessage()
		if err != nil {
			return
		}
		if d, ok := m.(*wire.Delivery); ok {
			c.dl <- d
			continue
		}
		id, _ := wire.ID(m)
		c.mu.Lock()
		ch := c.waiting[id]
		delete(c.waiting, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// start sends a request built for a fresh id and returns the channel its
// answer arrives on (never, if the connection dies first).
func (c *client) start(build func(id uint64) wire.Message) (<-chan wire.Message, error) {
	ch := make(chan wire.Message, 1)
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	c.waiting[id] = ch
	c.mu.Unlock()
	return ch, c.conn.WriteMessage(build(id))
}

func (c *client) call(build func(id uint64) wire.Message) wire.Message {
	c.t.Helper()
	ch, err := c.start(build)
	if err != nil {
		c.t.Fatalf("write: %v", err)
	}
	select {
	case m := <-ch:
		return m
	case <-c.closed:
		c.t.Fatal("connection closed while waiting for an answer")
	case <-time.After(waitFor):
		c.t.Fatal("no answer")
	}
	return nil
}

type cred struct {
	conv, p, gen uint64
	secret       wire.Secret
}

func token() wire.Token {
	var t wire.Token
	rand.Read(t[:])
	return t
}

func (c *client) enroll(conv uint64) cred {
	c.t.Helper()
	m := c.call(func(id uint64) wire.Message { return &wire.Enroll{ID: id, Conversation: conv, Token: token()} })
	e, ok := m.(*wire.Enrolled)
	if !ok {
		c.t.Fatalf("enroll answered %#v", m)
	}
	return cred{conv, e.Participant, e.Generation, e.Secret}
}

func (c *client) attach(cr cred) cred {
	c.t.Helper()
	m := c.call(func(id uint64) wire.Message {
		return &wire.Attach{ID: id, Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Secret: cr.secret, Token: token()}
	})
	a, ok := m.(*wire.Attached)
	if !ok {
		c.t.Fatalf("attach answered %#v", m)
	}
	return cred{cr.conv, a.Participant, a.Generation, a.Secret}
}

// answered is a tell that got its told before the kill.
type answered struct {
	tok     wire.Token
	payload []byte
	seq     uint64
	gen     uint64
}

// tellUntil pipelines tells of participant cr on c, 64 in flight, each
// with a fresh token and payload(n, token) for the n-th, until stop is
// closed or c's connection breaks. Each tell answered as a fresh commit
// is passed to told, from a goroutine of its own; any other answer fails
// the test. It returns once every tell sent has its answer or will have
// none (stop closed, or the connection broke).
func (c *client) tellUntil(cr cred, payload func(n int, tok wire.Token) []byte, stop <-chan struct{}, told func(answered)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	inflight := make(chan struct{}, 64)
	for n := 0; ; n++ {
		select {
		case inflight <- struct{}{}:
		case <-stop:
			return
		}
		tok := token()
		p := payload(n, tok)
		ch, err := c.start(func(id uint64) wire.Message {
			return &wire.Tell{ID: id, Conversation: cr.conv, Participant: cr.p, Generation: cr.gen, Token: tok, Payload: p}
		})
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case m := <-ch:
				<-inflight
				t, ok := m.(*wire.Told)
				if !ok || t.Replay != nil {
					c.t.Errorf("tell of %q answered %#v", p, m)
					return
				}
				told(answered{tok, p, t.Seq, cr.gen})
			case <-c.closed:
			case <-stop:
			}
		}()
	}
}

// TestKill_AnsweredTellsSurvive runs the binary, pipelines tells from one
// participant to another, SIGKILLs the server at a random moment, restarts
// it on the same data, and checks that every answered tell replays its
// seq, is delivered to the other participant after it re-attaches, and that
// the bindings of the killed run ended as died/unclean_restart. Three
// rounds, each killing at a different moment.
func TestKill_AnsweredTellsSurvive(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	const conv = 77
	p := startProc(t, bin, dir)
	a, b := dial(t, p.addr), dial(t, p.addr)
	ca, cb := a.enroll(conv), b.enroll(conv)
	// A acknowledges B's joined record (seq 2), so that the tells B
	// acknowledges settle and get compacted: later retries replay them
	// from receipts.
	if m := a.call(func(id uint64) wire.Message {
		return &wire.Ack{ID: id, Conversation: conv, Participant: ca.p, Generation: ca.gen, Through: 2}
	}); m.Type() != wire.TypeAcked {
		t.Fatalf("ack answered %#v", m)
	}
	var all []answered

	for round := range 3 {
		// Load: a sender pipelines tells until the connection breaks.
		var mu sync.Mutex
		var got []answered
		var wg sync.WaitGroup
		stop := make(chan struct{})
		// firstAnswer is closed at the first tell answered in this round:
		// the random kill moment is counted from there, so that a slow
		// start (a loaded machine) cannot leave the round with nothing
		// answered to check.
		firstAnswer := make(chan struct{})
		var firstOnce sync.Once
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := func(n int, _ wire.Token) []byte { return []byte(fmt.Sprintf("r%d-%d", round, n)) }
			a.tellUntil(ca, payload, stop, func(r answered) {
				mu.Lock()
				got = append(got, r)
				mu.Unlock()
				firstOnce.Do(func() { close(firstAnswer) })
			})
		}()
		select {
		case <-firstAnswer:
		case <-time.After(waitFor):
			t.Fatalf("round %d: no tell answered in %v", round, waitFor)
		}
		delay, _ := rand.Int(rand.Reader, big.NewInt(400))
		time.Sleep(time.Duration(delay.Int64()) * time.Millisecond) // the random kill moment, not a synchronization
		p.kill(t)
		<-a.closed
		<-b.closed
		close(stop)
		wg.Wait()
		if len(got) == 0 {
			t.Fatalf("round %d: no tell answered before the kill", round)
		}
		all = append(all, got...)
		t.Logf("round %d: %d tells answered before the kill", round, len(got))

		p = startProc(t, bin, dir)
		a, b = dial(t, p.addr), dial(t, p.addr)
		ca, cb = a.attach(ca), b.attach(cb)

		// Every answered tell (of every round so far) replays its seq.
		replays := make([]<-chan wire.Message, len(all))
		for i, r := range all {
			ch, err := a.start(func(id uint64) wire.Message {
				return &wire.Tell{ID: id, Conversation: conv, Participant: ca.p, Generation: r.gen, Token: r.tok, Payload: r.payload}
			})
			if err != nil {
				t.Fatal(err)
			}
			replays[i] = ch
		}
		for i, ch := range replays {
			select {
			case m := <-ch:
				told, ok := m.(*wire.Told)
				if !ok || told.Seq != all[i].seq || told.Replay == nil || *told.Replay != wire.ReplayCommitted {
					t.Fatalf("round %d: retry of tell seq %d answered %#v", round, all[i].seq, m)
				}
			case <-time.After(waitFor):
				t.Fatal("no answer to a retried tell")
			}
		}

		// B is delivered every tell answered this round, and the end of
		// A's killed binding; A is delivered the end of B's.
		want := make(map[uint64]string, len(got))
		for _, r := range got {
			want[r.seq] = string(r.payload)
		}
		var maxSeq uint64
		diedA := false
		for len(want) > 0 || !diedA {
			select {
			case d := <-b.dl:
				maxSeq = max(maxSeq, d.Seq)
				switch {
				case d.Kind == wire.KindRecord:
					if w, ok := want[d.Seq]; ok {
						if string(d.Payload) != w {
							t.Fatalf("round %d: seq %d delivered %q, want %q", round, d.Seq, d.Payload, w)
						}
						delete(want, d.Seq)
					}
				case d.Kind == wire.KindDied && d.Participant == ca.p && d.Cause != nil && *d.Cause == wire.CauseUncleanRestart:
					diedA = true
				}
			case <-time.After(waitFor):
				t.Fatalf("round %d: B still misses %d answered tells (died/unclean_restart of A seen: %v)", round, len(want), diedA)
			}
		}
		waitDied(t, a, cb.p)
		// B acknowledges what it saw, so the next round starts after it.
		if m := b.call(func(id uint64) wire.Message {
			return &wire.Ack{ID: id, Conversation: conv, Participant: cb.p, Generation: cb.gen, Through: maxSeq}
		}); m.Type() != wire.TypeAcked {
			t.Fatalf("ack answered %#v", m)
		}
	}
	// A final clean drain exits 0.
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("participantd after SIGTERM: %v; stderr:\n%s", err, p.stderr)
	}
	checkLogs(t, p.stderr)
	// The history B acknowledged was compacted on the way, so the retries
	// above replayed from receipts too.
	st, err := boltstore.Open(filepath.Join(dir, "participantd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if first, err := st.First(oplog.Stream(conv)); err != nil || first == 0 {
		t.Errorf("oplog of %d starts at row %d (%v): nothing was compacted during the run", conv, first, err)
	}
}

func waitDied(t *testing.T, c *client, p uint64) {
	t.Helper()
	for {
		select {
		case d := <-c.dl:
			if d.Kind == wire.KindDied && d.Participant == p && d.Cause != nil && *d.Cause == wire.CauseUncleanRestart {
				return
			}
		case <-time.After(waitFor):
			t.Fatalf("no died/unclean_restart of participant %d", p)
		}
	}
}

// checkLogs wants every stderr line to be JSON.
func checkLogs(t *testing.T, stderr *bytes.Buffer) {
	sc := bufio.NewScanner(bytes.NewReader(stderr.Bytes()))
	for sc.Scan() {
		if line := sc.Bytes(); len(line) > 0 && line[0] != '{' {
			t.Errorf("stderr line is not JSON: %s", line)
		}
	}
}
