package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/participantd/participantd/wire"
)

// The workloads of --memory: what an abusive client costs the server's
// own memory (anonymous RSS), measured black box from /proc.
const (
	// memDeafReader: a recipient that never reads, while another
	// participant tells it --volume bytes.
	memDeafReader = "deaf-reader"
	// memRefusedEnrolls: one connection enrolled in as many conversations
	// as it may, then --count enrolls refused.
	memRefusedEnrolls = "refused-enrolls"
)

// memoryConfig is the shape of a --memory run.
type memoryConfig struct {
	workload   string
	volume     int64 // deaf-reader: payload bytes told
	span       int64 // deaf-reader: the span of the first and last peaks
	payload    int   // deaf-reader: bytes per tell
	count      int   // refused-enrolls: enrolls refused
	window     int   // requests in flight
	serverBin  string
	serverArgs []string
	// heapProfile, with serverBin, is where the server's heap profile is
	// written at the end of the load (the server then runs with --pprof
	// and an admin token of the bench's).
	heapProfile string
	// settle is how long RSS is still sampled after the last answer.
	settle time.Duration
}

// memoryReport is one --memory run's figures. Growth is the peak minus
// the figure before the load, both read from /proc/<pid>/status.
type memoryReport struct {
	Workload string `json:"workload"`
	Server   string `json:"server"` // the binary started, or "--addr"
	// deaf-reader
	VolumeBytes int64 `json:"volume_bytes,omitempty"`
	Payload     int   `json:"payload_bytes,omitempty"`
	Told        int64 `json:"told,omitempty"`
	// refused-enrolls
	Enrolled int `json:"enrolled,omitempty"`
	Count    int `json:"count,omitempty"`

	Refused map[string]int64 `json:"refused,omitempty"`
	Seconds float64          `json:"seconds"`

	AnonBeforeKiB uint64 `json:"rss_anon_before_kib"`
	AnonPeakKiB   uint64 `json:"rss_anon_peak_kib"`
	AnonAfterKiB  uint64 `json:"rss_anon_after_kib"`
	// AnonMedianKiB is the median of the RssAnon samples under the load
	// (every 10 ms), and AnonDriftKiB the median of its last quarter less
	// that of its second: what the server holds still growing with what
	// the load sent, apart from the ramp of the first quarter and from
	// the collector's peaks, which a longer run meets more of. Both are 0
	// for a load of fewer than 8 samples.
	AnonMedianKiB uint64 `json:"rss_anon_median_kib,omitempty"`
	AnonDriftKiB  int64  `json:"rss_anon_drift_kib,omitempty"`
	// SpanBytes, with a deaf-reader volume of at least twice it, is the
	// span of the two peaks below: RssAnon's peak while the first
	// SpanBytes were told, and while the last were (rssSampler.spanPeaks).
	SpanBytes            int64  `json:"span_bytes,omitempty"`
	AnonFirstSpanPeakKiB uint64 `json:"rss_anon_first_span_peak_kib,omitempty"`
	AnonLastSpanPeakKiB  uint64 `json:"rss_anon_last_span_peak_kib,omitempty"`
	RSSBeforeKiB         uint64 `json:"rss_before_kib"`
	RSSPeakKiB           uint64 `json:"rss_peak_kib"`
	// Metrics are the server's figures at the end of the load.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	// RecipientCut is set when the deaf recipient's connection was closed
	// by the server by the end (write-progress-timeout).
	RecipientCut bool   `json:"recipient_cut,omitempty"`
	HeapProfile  string `json:"heap_profile,omitempty"`
	// ScrapeErrors are the failed reads of the server's metrics: what
	// they would have filled (Metrics, RecipientCut) is then unknown,
	// not zero.
	ScrapeErrors []string `json:"scrape_errors,omitempty"`
}

// scrape reads names from the metrics of the health listener at health,
// or records why it could not (ScrapeErrors) and returns false.
func (r *memoryReport) scrape(ctx context.Context, health string, names []string) (map[string]float64, bool) {
	m, err := scrapeMetrics(ctx, health, names)
	if err != nil {
		r.ScrapeErrors = append(r.ScrapeErrors, err.Error())
		return nil, false
	}
	return m, true
}

// connectionsOpen is the gauge of open TCP wire connections.
const connectionsOpen = `participantd_connections_open{transport="tcp"}`

// memoryMetrics are the server metrics the report carries, when present.
var memoryMetrics = []string{
	"participantd_backlog_bytes", "participantd_backlog_total_bytes", "participantd_backlog_records",
	"participantd_outbound_queued_bytes", "participantd_pending_request_bytes", connectionsOpen,
	"go_memstats_heap_inuse_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_next_gc_bytes",
}

func (r *memoryReport) print(b *strings.Builder) {
	switch r.Workload {
	case memDeafReader:
		fmt.Fprintf(b, "memory: %s, %.0f MiB told in %d tells of %d B to a recipient that never reads, in %.1f s (%.1f MiB/s)\n",
			r.Workload, float64(r.VolumeBytes)/(1<<20), r.Told, r.Payload, r.Seconds, float64(r.VolumeBytes)/(1<<20)/r.Seconds)
	case memRefusedEnrolls:
		fmt.Fprintf(b, "memory: %s, %d enrolls refused after %d committed, in %.1f s (%.0f/s)\n",
			r.Workload, r.Count, r.Enrolled, r.Seconds, float64(r.Count)/r.Seconds)
	}
	fmt.Fprintf(b, "  server: %s\n", r.Server)
	if len(r.Refused) > 0 {
		fmt.Fprintf(b, "  refused:")
		for code, n := range r.Refused {
			fmt.Fprintf(b, " %s %d", code, n)
		}
		b.WriteString("\n")
	}
	kib := func(k uint64) float64 { return float64(k) / 1024 }
	fmt.Fprintf(b, "  anonymous RSS: %.1f MiB before, peak %.1f MiB (+%.1f MiB), %.1f MiB after\n",
		kib(r.AnonBeforeKiB), kib(r.AnonPeakKiB), kib(r.AnonPeakKiB)-kib(r.AnonBeforeKiB), kib(r.AnonAfterKiB))
	if r.AnonMedianKiB > 0 {
		fmt.Fprintf(b, "  under the load: median %.1f MiB (+%.1f MiB); last quarter's median less the second's: %+.1f MiB\n",
			kib(r.AnonMedianKiB), kib(r.AnonMedianKiB)-kib(r.AnonBeforeKiB), float64(r.AnonDriftKiB)/1024)
	}
	if r.SpanBytes > 0 {
		fmt.Fprintf(b, "  peak while the first %.0f MiB were told: +%.1f MiB; while the last %.0f MiB were: +%.1f MiB\n",
			float64(r.SpanBytes)/(1<<20), kib(r.AnonFirstSpanPeakKiB)-kib(r.AnonBeforeKiB),
			float64(r.SpanBytes)/(1<<20), kib(r.AnonLastSpanPeakKiB)-kib(r.AnonBeforeKiB))
	}
	fmt.Fprintf(b, "  RSS (file pages too): %.1f MiB before, peak %.1f MiB (+%.1f MiB)\n",
		kib(r.RSSBeforeKiB), kib(r.RSSPeakKiB), kib(r.RSSPeakKiB)-kib(r.RSSBeforeKiB))
	if len(r.Metrics) > 0 {
		b.WriteString("  at the end of the load:")
		for _, name := range memoryMetrics {
			if v, ok := r.Metrics[name]; ok {
				if strings.HasSuffix(name, "_bytes") {
					fmt.Fprintf(b, " %s %.1f MiB;", strings.TrimPrefix(name, "participantd_"), v/(1<<20))
				} else if name == connectionsOpen {
					fmt.Fprintf(b, " connections_open %.0f;", v)
				} else {
					fmt.Fprintf(b, " %s %.0f;", strings.TrimPrefix(name, "participantd_"), v)
				}
			}
		}
		b.WriteString("\n")
	}
	if r.Workload == memDeafReader {
		if len(r.ScrapeErrors) > 0 {
			b.WriteString("  recipient cut by the server by the end: unknown (a metrics read failed)\n")
		} else {
			fmt.Fprintf(b, "  recipient cut by the server by the end: %v\n", r.RecipientCut)
		}
	}
	for _, e := range r.ScrapeErrors {
		fmt.Fprintf(b, "  metrics read failed: %s\n", e)
	}
	if r.HeapProfile != "" {
		fmt.Fprintf(b, "  server heap profile: %s\n", r.HeapProfile)
	}
}

// parseSize reads a byte count: a number with an optional B, KiB, MiB or
// GiB suffix.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a number of bytes, KiB, MiB or GiB", s)
	}
	return n * mult, nil
}

// sizeFlag is a flag.Value of a byte count.
type sizeFlag struct{ n *int64 }

func (f sizeFlag) String() string {
	if f.n == nil {
		return "0"
	}
	return strconv.FormatInt(*f.n, 10)
}

func (f sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*f.n = n
	return nil
}

// listFlag is a repeatable string flag.
type listFlag struct{ l *[]string }

func (f listFlag) String() string {
	if f.l == nil {
		return ""
	}
	return strings.Join(*f.l, " ")
}

func (f listFlag) Set(s string) error {
	*f.l = append(*f.l, s)
	return nil
}

func (c *memoryConfig) check(f *benchFlags) error {
	switch c.workload {
	case memDeafReader, memRefusedEnrolls:
	default:
		return fmt.Errorf("--memory %q: want %s or %s", c.workload, memDeafReader, memRefusedEnrolls)
	}
	if f.embedded {
		return errors.New("--memory measures a server process of its own: give --server-bin, or --addr with --server-pid")
	}
	if (c.serverBin == "") == (f.addr == "") {
		return errors.New("--memory needs exactly one of --server-bin and --addr")
	}
	if f.addr != "" && f.serverPID <= 0 {
		return errors.New("--memory with --addr needs --server-pid")
	}
	if c.heapProfile != "" && c.serverBin == "" {
		return errors.New("--heap-profile needs --server-bin (the bench then starts the server with --pprof)")
	}
	if c.volume <= 0 || c.payload <= 0 || c.count <= 0 || c.window <= 0 || c.settle < 0 || c.span < 0 {
		return errors.New("--volume, --memory-payload, --count and --memory-window must be positive, --memory-settle and --memory-span not negative")
	}
	return nil
}

// runMemory runs the --memory workload against the server of f (one it
// starts from --server-bin on a fresh data directory, or --addr), and
// fills rep.Memory.
func runMemory(ctx context.Context, f *benchFlags, rep *benchReport) error {
	c := &f.memory
	r := &memoryReport{Workload: c.workload, Server: "--addr " + f.addr, Metrics: map[string]float64{}}
	pid, addr, health := f.serverPID, f.addr, f.metricsAddr
	var sp *serverProc
	if c.serverBin != "" {
		var err error
		if sp, err = startServerProc(ctx, c.serverBin, c.serverArgs, c.heapProfile != "", c.workload); err != nil {
			return err
		}
		defer sp.stop()
		pid, addr, health = sp.cmd.Process.Pid, sp.addr, sp.health
		r.Server = strings.Join(append([]string{c.serverBin}, sp.args...), " ")
	}
	var err error
	switch c.workload {
	case memDeafReader:
		err = memoryDeafReader(ctx, c, pid, addr, health, r)
	case memRefusedEnrolls:
		err = memoryRefusedEnrolls(ctx, c, pid, addr, r)
	}
	if err != nil {
		if sp != nil {
			err = fmt.Errorf("%w; server stderr:\n%s", err, sp.stderr.tail())
		}
		return err
	}
	if health != "" {
		if m, ok := r.scrape(ctx, health, memoryMetrics); ok {
			for k, v := range m {
				if _, set := r.Metrics[k]; !set {
					r.Metrics[k] = v
				}
			}
		}
	}
	if c.heapProfile != "" {
		if err := sp.heapProfile(ctx, c.heapProfile); err != nil {
			return err
		}
		r.HeapProfile = c.heapProfile
	}
	rep.Memory = r
	return nil
}

// memToken mints token n of one stream (a connection) of a run: a UUIDv7
// of the current time whose other bits are the run's nonce (its 24 high
// bits), the stream and n, so that a server running a token window takes
// it and no two of a run collide.
func memToken(nonce, stream, n uint64) wire.Token {
	hi := nonce >> 40
	return wire.TokenV7(time.Now().UnixMilli(), uint16(hi>>12), (hi&0xfff)<<50|(stream&3)<<48|n&(1<<48-1))
}

// memoryDeafReader enrolls a recipient that never reads, then tells it
// c.volume bytes from another connection, c.window tells in flight.
func memoryDeafReader(ctx context.Context, c *memoryConfig, pid int, addr, health string, r *memoryReport) error {
	nonce := newNonce()
	conv := nonce | 1
	deaf, err := dialBench(ctx, addr)
	if err != nil {
		return err
	}
	defer deaf.wc.Close()
	// The deaf recipient reads its enroll answer, and nothing after.
	if err := deaf.wc.WriteMessage(&wire.Enroll{ID: 1, Conversation: conv, Token: memToken(nonce, 0, 1)}); err != nil {
		return err
	}
	if m, err := deaf.wc.ReadServerMessage(); err != nil {
		return err
	} else if _, ok := m.(*wire.Enrolled); !ok {
		return fmt.Errorf("the deaf recipient's enroll answered %s %+v", m.Type(), m)
	}
	sender, err := dialBench(ctx, addr)
	if err != nil {
		return err
	}
	sender.start()
	defer sender.close()
	var tokens atomic.Uint64
	token := func() wire.Token { return memToken(nonce, 1, tokens.Add(1)) }
	m, err := sender.call(ctx, &wire.Enroll{Conversation: conv, Token: token()})
	if err != nil {
		return fmt.Errorf("the sender's enroll: %w", err)
	}
	en := m.(*wire.Enrolled)

	var openBefore float64
	if m, ok := r.scrape(ctx, health, []string{connectionsOpen}); ok {
		openBefore = m[connectionsOpen]
	}
	var told atomic.Uint64
	s, err := startRSSSampler(pid, told.Load)
	if err != nil {
		return err
	}
	payload := bytes.Repeat([]byte{0xab}, c.payload)
	n := (c.volume + int64(c.payload) - 1) / int64(c.payload)
	r.VolumeBytes, r.Payload = n*int64(c.payload), c.payload
	start := time.Now()
	refused, err := pipeline(ctx, sender, int(n), c.window, func() wire.Message {
		return &wire.Tell{Conversation: conv, Participant: en.Participant, Generation: en.Generation, Token: token(), Payload: payload}
	}, func(m wire.Message) error {
		if _, ok := m.(*wire.Told); !ok {
			return fmt.Errorf("tell answered %s %+v", m.Type(), m)
		}
		told.Add(uint64(c.payload))
		return nil
	}, wire.CodeBacklogFull)
	r.Seconds = time.Since(start).Seconds()
	s.loadEnded()
	if err != nil {
		s.stop()
		return err
	}
	r.Refused, r.Told = refused, n-refused[string(wire.CodeBacklogFull)]
	if m, ok := r.scrape(ctx, health, memoryMetrics); ok {
		r.Metrics = m
	}
	sleep(ctx, c.settle)
	s.stop()
	s.fill(r)
	var nFirst, nLast int
	r.AnonFirstSpanPeakKiB, r.AnonLastSpanPeakKiB, nFirst, nLast = s.spanPeaks(uint64(c.span), uint64(told.Load()))
	if nFirst == 0 || nLast == 0 {
		r.AnonFirstSpanPeakKiB, r.AnonLastSpanPeakKiB = 0, 0
	} else {
		r.SpanBytes = c.span
	}
	if m, ok := r.scrape(ctx, health, []string{connectionsOpen}); ok && openBefore > 0 {
		if open, ok := m[connectionsOpen]; ok {
			r.RecipientCut = open < openBefore
		}
	}
	return nil
}

// memoryRefusedEnrolls enrolls one connection in new conversations until
// the server refuses (its per-connection cap), then sends c.count more
// enrolls of new conversations, every one refused.
func memoryRefusedEnrolls(ctx context.Context, c *memoryConfig, pid int, addr string, r *memoryReport) error {
	nonce := newNonce()
	conn, err := dialBench(ctx, addr)
	if err != nil {
		return err
	}
	conn.start()
	defer conn.close()
	var tokens atomic.Uint64
	token := func() wire.Token { return memToken(nonce, 0, tokens.Add(1)) }
	var next atomic.Uint64
	enroll := func() wire.Message {
		return &wire.Enroll{Conversation: nonce | next.Add(1), Token: token()}
	}
	// Fill: enroll until the first refusal that is not rate_limited.
	for full := false; !full; {
		m, err := conn.call(ctx, enroll())
		var we *wire.Error
		switch {
		case err == nil:
			if _, ok := m.(*wire.Enrolled); !ok {
				return fmt.Errorf("enroll answered %s %+v", m.Type(), m)
			}
			r.Enrolled++
		case errors.As(err, &we) && we.Code == wire.CodeCapacityExceeded:
			full = true
		default:
			return fmt.Errorf("filling the connection's conversations (give the server a --conversation-burst above its --max-conversations-per-conn): %w", err)
		}
	}
	s, err := startRSSSampler(pid, nil)
	if err != nil {
		return err
	}
	start := time.Now()
	refused, err := pipeline(ctx, conn, c.count, c.window, enroll, func(m wire.Message) error {
		return fmt.Errorf("an enroll past the cap answered %s %+v", m.Type(), m)
	}, wire.CodeCapacityExceeded, wire.CodeRateLimited)
	r.Seconds = time.Since(start).Seconds()
	s.loadEnded()
	sleep(ctx, c.settle)
	s.stop()
	if err != nil {
		return err
	}
	r.Count, r.Refused = c.count, refused
	s.fill(r)
	return nil
}

// pipeline sends n requests made by build on c, at most window in flight,
// and waits for every answer. An error answer whose code is in refusals
// is counted by code; any other error answer, a success that ok refuses
// or the end of the connection fails the run.
func pipeline(ctx context.Context, c *benchConn, n, window int, build func() wire.Message, ok func(wire.Message) error, refusals ...wire.Code) (map[string]int64, error) {
	sem := make(chan struct{}, window)
	var (
		mu      sync.Mutex
		refused = map[string]int64{}
		first   error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	for i := 0; i < n && failed() == nil; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return refused, ctx.Err()
		}
		err := c.send(build(), func(m wire.Message) {
			defer func() { <-sem }()
			switch a := m.(type) {
			case nil:
				fail(errConnClosed)
			case *wire.Error:
				for _, code := range refusals {
					if a.Code == code {
						mu.Lock()
						refused[string(code)]++
						mu.Unlock()
						return
					}
				}
				fail(a)
			default:
				if err := ok(m); err != nil {
					fail(err)
				}
			}
		})
		if err != nil {
			return refused, err
		}
	}
	for range window {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return refused, ctx.Err()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return refused, first
}
