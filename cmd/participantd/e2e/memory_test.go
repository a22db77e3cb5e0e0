package e2e_test

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/participantd/participantd/wire"
)

// abuse runs TestMemoryUnderAnAbusiveClient, which takes a minute or more
// and writes a few hundred MiB to a temporary directory:
//
//	go test ./cmd/participantd/e2e -run TestMemoryUnderAnAbusiveClient -abuse -v
//
// ABUSE_BIN=/path/to/participantd measures that binary instead of
// building this tree's.
var abuse = flag.Bool("abuse", false, "run the memory measurement under an abusive client (BENCHMARKS.md)")

// rss returns the resident set size of process pid, from /proc.
func rss(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmRSS:") }

// procStatus returns a kB field of /proc/<pid>/status, in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read /proc status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc status", field)
	return 0
}

// peakRSS samples pid's RSS every 10ms until stop is called, and returns
// the highest sample.
func peakRSS(t *testing.T, pid int) (stop func() int64) { return peakOf(t, pid, "VmRSS:") }

// peakOf samples a kB field of /proc/<pid>/status every 10ms until stop is
// called, and returns the highest sample.
func peakOf(t *testing.T, pid int, field string) (stop func() int64) {
	var peak atomic.Int64
	peak.Store(procStatus(t, pid, field))
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-quit:
				return
			}
			if r := procStatus(t, pid, field); r > peak.Load() {
				peak.Store(r)
			}
		}
	})
	return func() int64 {
		close(quit)
		wg.Wait()
		return peak.Load()
	}
}

// pipeline sends n requests built by build, at most window in flight, and
// passes every answer to check.
func (c *client) pipeline(n, window int, build func(i int, id uint64) wire.Message, check func(wire.Message)) {
	c.t.Helper()
	for sent := 0; sent < n; {
		w := min(window, n-sent)
		chans := make([]<-chan wire.Message, w)
		for k := range w {
			ch, err := c.start(func(id uint64) wire.Message { return build(sent+k, id) })
			if err != nil {
				c.t.Fatalf("write: %v", err)
			}
			chans[k] = ch
		}
		for _, ch := range chans {
			select {
			case m := <-ch:
				check(m)
			case <-c.closed:
				c.t.Fatal("connection closed while waiting for an answer")
			case <-time.After(time.Minute):
				c.t.Fatal("no answer within a minute")
			}
		}
		sent += w
	}
}

// deafConn enrolls in conv on a fresh connection and then never reads.
func deafConn(t *testing.T, addr string, conv uint64) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	w := wire.NewWriter(nc, min(1<<31, math.MaxInt))
	r := wire.NewReader(bufio.NewReader(nc), 16<<20)
	read := func() wire.Message {
		body, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		m, err := wire.DecodeServerMessage(body)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		return m
	}
	w.WriteFrame(wire.Encode(&wire.Hello{Versions: []uint64{1}}))
	if _, ok := read().(*wire.Welcome); !ok {
		t.Fatal("no welcome")
	}
	w.WriteFrame(wire.Encode(&wire.Enroll{ID: 1, Conversation: conv, Token: token()}))
	if _, ok := read().(*wire.Enrolled); !ok {
		t.Fatal("enroll refused")
	}
	return nc
}

func (p *proc) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.health + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	for _, line := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return -1
}

const mib = 1 << 20

// TestMemoryUnderAnAbusiveClient measures the real binary's resident
// memory, default settings, idle and under three abusive clients, each
// against a fresh process: (a) 200,000 enrolls refused capacity_exceeded
// from one connection (after 1,300 pipelined enrolls against the cap of
// 1,024), (b) 200 MiB of 64 KiB tells to a recipient that never reads,
// (c) 200 MiB of maximum-size (512 KiB) tells to a recipient that never
// reads, (d) 1,000,000 zero-byte tells to a recipient that never reads.
// It checks the targets of BENCHMARKS.md: (a) grows RSS by less than
// 64 MiB, (b) anonymous RSS by less than 64 MiB, (d) anonymous RSS by less than
// 128 MiB, with at most --max-backlog-records of the tells committed.
func TestMemoryUnderAnAbusiveClient(t *testing.T) {
	if !*abuse {
		t.Skip("run with -abuse (see BENCHMARKS.md)")
	}
	bin := os.Getenv("ABUSE_BIN") // to measure another build, e.g. an older one
	if bin == "" {
		bin = buildBinary(t)
	}
	report := func(name string, idle, peak, end int64, extra string) {
		t.Logf("%-44s idle %6.1f MiB  peak %6.1f MiB (+%5.1f)  end %6.1f MiB  %s",
			name, float64(idle)/mib, float64(peak)/mib, float64(peak-idle)/mib, float64(end)/mib, extra)
	}

	t.Run("refused enrolls", func(t *testing.T) {
		// The conversations are created at once: this measures the
		// refusals, not the creation rate.
		p := startProc(t, bin, t.TempDir(), "PARTICIPANTD_CONVERSATION_BURST=2000")
		pid := p.cmd.Process.Pid
		c := dial(t, p.addr)
		idle := rss(t, pid)
		stop := peakRSS(t, pid)
		committed, refused := 0, 0
		count := func(m wire.Message) {
			switch a := m.(type) {
			case *wire.Enrolled:
				committed++
			case *wire.Error:
				if a.Code != wire.CodeCapacityExceeded {
					t.Fatalf("enroll answered %v: %s", a.Code, a.Detail)
				}
				refused++
			default:
				t.Fatalf("enroll answered %#v", m)
			}
		}
		c.pipeline(1300, 1300, func(i int, id uint64) wire.Message {
			return &wire.Enroll{ID: id, Conversation: uint64(1 + i), Token: token()}
		}, count)
		if committed != 1024 {
			t.Errorf("1,300 pipelined enrolls committed %d, want the cap, 1,024", committed)
		}
		start := time.Now()
		refused = 0
		c.pipeline(200_000, 512, func(i int, id uint64) wire.Message {
			return &wire.Enroll{ID: id, Conversation: uint64(1_000_000 + i), Token: token()}
		}, count)
		took := time.Since(start)
		peak := stop()
		end := rss(t, pid)
		report("(a) 200,000 refused enrolls", idle, peak, end,
			fmt.Sprintf("refused %d in %v (%.0f/s)", refused, took.Round(time.Millisecond), float64(refused)/took.Seconds()))
		if peak-idle >= 64*mib {
			t.Errorf("200,000 refused enrolls grew RSS by %.1f MiB, want < 64 MiB", float64(peak-idle)/mib)
		}
	})

	deaf := func(name string, size int, limit func(rssGrowth int64) bool, anonLimit int64) {
		t.Run(name, func(t *testing.T) {
			p := startProc(t, bin, t.TempDir())
			pid := p.cmd.Process.Pid
			deafConn(t, p.addr, 1)
			c := dial(t, p.addr)
			cr := c.enroll(1)
			idle, idleAnon := rss(t, pid), procStatus(t, pid, "RssAnon:")
			stop, stopAnon := peakRSS(t, pid), peakOf(t, pid, "RssAnon:")
			payload := bytes.Repeat([]byte{0xab}, size)
			n := 200 * mib / size
			start := time.Now()
			c.pipeline(n, 32, func(_ int, id uint64) wire.Message {
				return &wire.Tell{ID: id, Conversation: 1, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: payload}
			}, func(m wire.Message) {
				if _, ok := m.(*wire.Told); !ok {
					t.Fatalf("tell answered %#v", m)
				}
			})
			took := time.Since(start)
			backlog, total := p.metric(t, "participantd_backlog_bytes")/mib, p.metric(t, "participantd_backlog_total_bytes")/mib
			// The deaf recipient is cut once its oldest frame waited
			// write-progress-timeout (default 30s).
			cut := time.Now()
			tick := time.NewTicker(100 * time.Millisecond)
			for p.metric(t, `participantd_connections_open{transport="tcp"}`) != 1 {
				if time.Since(cut) > time.Minute {
					t.Fatal("the deaf recipient is still connected a minute after the tells")
				}
				<-tick.C
			}
			tick.Stop()
			peak, peakAnon := stop(), stopAnon()
			end := rss(t, pid)
			report(name, idle, peak, end, fmt.Sprintf("anon idle %.1f peak %.1f (+%.1f) MiB; sent in %v (%.1f MiB/s); backlog %.0f MiB in memory of %.0f MiB; recipient cut %v after the last tell",
				float64(idleAnon)/mib, float64(peakAnon)/mib, float64(peakAnon-idleAnon)/mib,
				took.Round(time.Millisecond), 200/took.Seconds(), backlog, total, time.Since(cut).Round(100*time.Millisecond)))
			if limit(peak - idle) {
				t.Errorf("200 MiB told to a recipient that never reads grew RSS (file pages included) by %.1f MiB", float64(peak-idle)/mib)
			}
			if peakAnon-idleAnon >= anonLimit {
				t.Errorf("200 MiB told to a recipient that never reads grew anonymous RSS by %.1f MiB, want < %d MiB", float64(peakAnon-idleAnon)/mib, anonLimit/mib)
			}
		})
	}
	// The target holds on the anonymous part of RSS, the process's own
	// memory: the 200 MiB told land in the bbolt file, whose mapped pages
	// (page cache, clean and reclaimable) add tens of MiB of RssFile as the
	// checkpoint and the readers touch them. The whole RSS is reported, and
	// checked against a bound that leaves room for those file pages. The
	// issue's target (< 64 MiB anonymous) is for (b); with maximum payloads (c) the
	// log-first store's group-commit records and checkpoint transactions
	// are larger, and its bound is looser (figures in BENCHMARKS.md).
	deaf("(b) 200 MiB of 64 KiB tells, deaf recipient", 64<<10, func(g int64) bool { return g >= 192*mib }, 64*mib)
	deaf("(c) 200 MiB of 512 KiB tells, deaf recipient", 512<<10, func(g int64) bool { return g >= 256*mib }, 192*mib)

	// (d) Zero-byte tells cost no payload, only each retained record's
	// metadata: without a bound on records, a member that never
	// acknowledges makes every tell cost memory. With the default
	// --max-backlog-records (65,536) the conversation is refused
	// backlog_full past it, and the rest of the tells change nothing.
	//
	// It runs with the default checkpoint settings: a checkpoint holds
	// every retained record, and the 10 ms interval of the other cases
	// would re-encode 65,536 of them a hundred times a second.
	t.Run("(d) 1,000,000 zero-byte tells, deaf recipient", func(t *testing.T) {
		const n = 1_000_000
		p := startProc(t, bin, t.TempDir(), "PARTICIPANTD_CHECKPOINT_INTERVAL=10s", "PARTICIPANTD_CHECKPOINT_ROWS=4096", "PARTICIPANTD_RETAIN=168h")
		pid := p.cmd.Process.Pid
		deafConn(t, p.addr, 1)
		c := dial(t, p.addr)
		cr := c.enroll(1)
		idle, idleAnon := rss(t, pid), procStatus(t, pid, "RssAnon:")
		stop, stopAnon := peakRSS(t, pid), peakOf(t, pid, "RssAnon:")
		committed, refused := 0, 0
		start := time.Now()
		c.pipeline(n, 512, func(_ int, id uint64) wire.Message {
			return &wire.Tell{ID: id, Conversation: 1, Participant: cr.p, Generation: cr.gen, Token: token(), Payload: []byte{}}
		}, func(m wire.Message) {
			switch a := m.(type) {
			case *wire.Told:
				committed++
			case *wire.Error:
				if a.Code != wire.CodeBacklogFull {
					t.Fatalf("tell answered %v: %s", a.Code, a.Detail)
				}
				refused++
			default:
				t.Fatalf("tell answered %#v", m)
			}
		})
		took := time.Since(start)
		records := p.metric(t, "participantd_backlog_records")
		peak, peakAnon := stop(), stopAnon()
		end := rss(t, pid)
		report("(d) 1,000,000 zero-byte tells, deaf recipient", idle, peak, end, fmt.Sprintf("anon idle %.1f peak %.1f (+%.1f) MiB; %d committed, %d refused backlog_full in %v; %.0f records retained",
			float64(idleAnon)/mib, float64(peakAnon)/mib, float64(peakAnon-idleAnon)/mib, committed, refused, took.Round(time.Millisecond), records))
		if committed > 1<<16 {
			t.Errorf("%d zero-byte tells to a deaf member committed, past --max-backlog-records (65,536)", committed)
		}
		// 65,536 records are some 7 MiB of metadata in the live state;
		// the checkpointer's rebuilt copy and the garbage collector's
		// headroom (GOGC=100) multiply it. Without the bound, every tell
		// commits and the growth is several times this.
		if peakAnon-idleAnon >= 128*mib {
			t.Errorf("%d zero-byte tells to a deaf member grew anonymous RSS by %.1f MiB, want < 128 MiB", n, float64(peakAnon-idleAnon)/mib)
		}
	})
}
