package robustness_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"
)

// A nemesis injects one fault into one node and returns how to heal it
// (Jepsen's nemeses; etcd robustness's failpoints). Every fault is one a
// real deployment meets: a crash, a stopped process (GC pause, suspended
// VM), a network partition on either side of a node, a wall clock that is
// off or jumps.
type nemesis struct {
	name string
	// hold is how long the fault lasts before heal, drawn per event.
	hold func(r *rand.Rand) time.Duration
	// inject starts the fault; heal ends it.
	inject func(ctx context.Context, nd *node, r *rand.Rand) (what string, heal func() error, err error)
}

func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// nemeses is every fault the schedule draws from.
var nemeses = []nemesis{
	{
		name: "kill",
		hold: func(r *rand.Rand) time.Duration { return between(r, 0, leaseTTL/2) },
		inject: func(_ context.Context, nd *node, _ *rand.Rand) (string, func() error, error) {
			nd.kill()
			return "SIGKILL " + nd.id, nd.start, nil
		},
	},
	{
		// Longer than the lease: etcd expires it, another node claims the
		// conversations, and the paused one wakes up believing it owns
		// them until its own deadline check.
		name: "pause",
		hold: func(r *rand.Rand) time.Duration { return between(r, leaseTTL*3/2, 5*leaseTTL/2) },
		inject: func(_ context.Context, nd *node, _ *rand.Rand) (string, func() error, error) {
			if !nd.signal(syscall.SIGSTOP) {
				return "", nil, fmt.Errorf("SIGSTOP %s: not running", nd.id)
			}
			return "SIGSTOP " + nd.id, func() error { nd.signal(syscall.SIGCONT); return nil }, nil
		},
	},
	{
		name: "partition-etcd",
		hold: func(r *rand.Rand) time.Duration { return between(r, leaseTTL, 5*leaseTTL/2) },
		inject: func(ctx context.Context, nd *node, _ *rand.Rand) (string, func() error, error) {
			var heals []func()
			for _, p := range nd.toEtcd {
				heal, err := partitionProxy(ctx, p)
				if err != nil {
					for _, h := range heals {
						h()
					}
					return "", nil, err
				}
				heals = append(heals, heal)
			}
			return "partition " + nd.id + " from every etcd member", func() error {
				for _, h := range heals {
					h()
				}
				return nil
			}, nil
		},
	},
	{
		name: "partition-clients",
		hold: func(r *rand.Rand) time.Duration { return between(r, leaseTTL/2, 2*leaseTTL) },
		inject: func(ctx context.Context, nd *node, _ *rand.Rand) (string, func() error, error) {
			heal, err := partitionProxy(ctx, nd.front)
			if err != nil {
				return "", nil, err
			}
			return "partition the clients from " + nd.id, func() error { heal(); return nil }, nil
		},
	},
	{
		// The offset stays after the event (skew between nodes); a later
		// event on the node jumps it again, forward or back. Within the
		// token window's skew allowance (participant.DefaultTokenSkew).
		name: "clock",
		hold: func(*rand.Rand) time.Duration { return 0 },
		inject: func(_ context.Context, nd *node, r *rand.Rand) (string, func() error, error) {
			d := between(r, -45*time.Second, 45*time.Second).Truncate(time.Second)
			if err := nd.setClock(d); err != nil {
				return "", nil, err
			}
			return fmt.Sprintf("clock of %s offset by %v", nd.id, d), func() error { return nil }, nil
		},
	},
}

// event is one planned fault.
type event struct {
	At      time.Duration // after the run began
	Nemesis string
	Node    int
	Hold    time.Duration
}

func (e event) String() string {
	return fmt.Sprintf("at %6.1fs  %-17s node n%d  for %v", e.At.Seconds(), e.Nemesis, e.Node+1, e.Hold.Round(time.Millisecond))
}

// plan draws the seed's schedule for a run of length d: one fault at a
// time, each followed by a settling time of half a lease to a lease, so
// that failover completes between faults and traffic makes progress. The
// kinds come in rounds, each a permutation of every nemesis, so that even
// a short run meets most of them.
func plan(seed uint64, d time.Duration, nodes int, kinds []nemesis) []event {
	r := rand.New(rand.NewPCG(seed, 0x726f62757374))
	var out []event
	var round []int
	at := between(r, leaseTTL/2, leaseTTL)
	for {
		if len(round) == 0 {
			round = r.Perm(len(kinds))
		}
		n := kinds[round[0]]
		round = round[1:]
		e := event{At: at, Nemesis: n.name, Node: r.IntN(nodes), Hold: n.hold(r)}
		if e.At+e.Hold > d {
			return out
		}
		out = append(out, e)
		at = e.At + e.Hold + between(r, leaseTTL/2, leaseTTL)
	}
}

// timeline is what the nemesis did, when (ms since the run began).
type timeline struct {
	mu      sync.Mutex
	entries []string
}

func (tl *timeline) add(h *history, format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.entries = append(tl.entries, fmt.Sprintf("%7d ms  ", h.ms(time.Now()))+fmt.Sprintf(format, args...))
}

func (tl *timeline) lines() []string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]string(nil), tl.entries...)
}

// runNemesis carries out events; it returns when they are done (every
// fault healed) or ctx ends (the fault in progress is healed first). A
// heal that fails (a killed node that does not start again) is a
// violation; the node is started once more, as a supervisor would, and
// an error is a node that could not be brought back at all.
func runNemesis(ctx context.Context, h *harness, hist *history, tl *timeline, seed uint64, events []event, violate func(inv, detail string)) error {
	r := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	byName := map[string]nemesis{}
	for _, n := range nemeses {
		byName[n.name] = n
	}
	for _, e := range events {
		if !pause(ctx, time.Until(hist.began.Add(e.At))) {
			return nil
		}
		nd := h.nodes[e.Node]
		what, heal, err := byName[e.Nemesis].inject(ctx, nd, r)
		if err != nil {
			tl.add(hist, "%s: not injected: %v", e.Nemesis, err)
			continue
		}
		tl.add(hist, "inject %s", what)
		pause(context.WithoutCancel(ctx), e.Hold)
		if err := heal(); err != nil {
			tl.add(hist, "heal %s FAILED: %v", what, err)
			violate(InvNodeRestarts, fmt.Sprintf("at %d ms, heal %s: %v", hist.ms(time.Now()), what, err))
			if !nd.running() {
				if err := nd.start(); err != nil {
					return fmt.Errorf("%s does not start again: %w", nd.id, err)
				}
				tl.add(hist, "started %s again", nd.id)
			}
		}
		if e.Hold > 0 {
			tl.add(hist, "healed %s", what)
		}
	}
	return nil
}
