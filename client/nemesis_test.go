package client_test

// The client's fault model: Client and Cluster under a nemesis that
// strikes requests at random (a connection dropped before or after the
// commit, in_doubt, an answer never sent on an open connection,
// unavailable, moved storms between two nodes, backlog_full) while
// writers tell (some payloads too large), then detach or leave, and
// readers only read. Every call's answer is checked against the fake
// server's history (docs/clients.md, What a client's answers promise).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

var nemesisSeeds = flag.Int("client.nemesis.seeds", 0, "seeds of TestNemesis_ClientAnswers per mode (0: 2 under -short, 20 otherwise)")

// api is what Client and Cluster both offer.
type api interface {
	Enroll(ctx context.Context, conv uint64, opts ...client.CallOption) (client.Credential, error)
	Tell(ctx context.Context, cred client.Credential, payload []byte, opts ...client.CallOption) (uint64, error)
	Detach(ctx context.Context, cred client.Credential, opts ...client.CallOption) (uint64, error)
	Leave(ctx context.Context, cred client.Credential, opts ...client.CallOption) (uint64, error)
	Ack(ctx context.Context, cred client.Credential, through uint64) (uint64, error)
	Deliveries() <-chan client.Delivery
	Close() error
}

// ncall is one call of the workload and its answer.
type ncall struct {
	op         string // tell, detach, leave
	cred       client.Credential
	tok        wire.Token
	oversized  bool
	seq        uint64
	err        error
	start, end time.Time
}

func TestNemesis_ClientAnswers(t *testing.T) {
	seeds := *nemesisSeeds
	if seeds == 0 {
		seeds = 20
		if testing.Short() {
			seeds = 2
		}
	}
	for _, mode := range []string{"client", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			for seed := 1; seed <= seeds; seed++ {
				t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runNemesis(t, mode, uint64(seed)) })
			}
		})
	}
}

// nemesisFault draws what the nemesis does to one request.
func nemesisFault(rng *rand.Rand, cluster bool, m wire.Message) (action, wire.Code) {
	switch m.(type) {
	case *wire.Tell, *wire.Detach, *wire.Leave, *wire.Attach, *wire.Ack:
	default:
		return pass, ""
	}
	_, attach := m.(*wire.Attach)
	switch n := rng.IntN(100); {
	case n < 5:
		return dropBefore, ""
	case n < 10:
		return commitThenDrop, ""
	case n < 15:
		return commitInDoubt, ""
	case n < 18:
		return swallow, ""
	case n < 23:
		return refuse, wire.CodeUnavailable
	case n < 28 && (cluster || !attach):
		// A plain Client forgets a participant whose re-attachment is
		// moved: that node no longer serves it, and it has no other.
		return refuse, wire.CodeMoved
	case n < 31:
		return backlogFull, ""
	}
	return pass, ""
}

func runNemesis(t *testing.T, mode string, seed uint64) {
	ctx := testCtx(t)
	srv := newFakeServer(t)
	srv.mu.Lock()
	srv.reoffer = true
	srv.mu.Unlock()
	addrs := []string{srv.addr(), srv.addNode()}
	cluster := mode == "cluster"

	var lostMu sync.Mutex
	var lost []string
	opts := client.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		AnswerTimeout: 100 * time.Millisecond, BindingCheckInterval: -1,
		OnLost: func(cred client.Credential, why error) {
			lostMu.Lock()
			lost = append(lost, fmt.Sprintf("%v: %v", cred, why))
			lostMu.Unlock()
		}}
	dial := func(name string) api {
		o := opts
		o.ClientName = name
		if cluster {
			c, err := client.DialCluster(ctx, addrs, client.ClusterOptions{Options: o, AttemptTimeout: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		c, err := client.Dial(ctx, addrs[0], o)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	writers, readers := dial("writers"), dial("readers")
	defer writers.Close()
	defer readers.Close()

	// Setup, without faults: a reader and a writer per conversation.
	convs := []uint64{1, 2}
	wcred := map[uint64]client.Credential{}
	rcred := map[uint64]client.Credential{}
	for _, conv := range convs {
		r, err := readers.Enroll(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		w, err := writers.Enroll(ctx, conv)
		if err != nil {
			t.Fatal(err)
		}
		rcred[conv], wcred[conv] = r, w
	}

	// The readers' deliveries, collected all along.
	var delMu sync.Mutex
	got := map[uint64][]client.Delivery{}
	readDone := make(chan struct{})
	// The readers ack every third delivery, through an acker of their
	// own (a slow ack does not hold the deliveries back): a retried ack
	// the cursor passed meanwhile is acked too.
	type ackCall struct {
		cred            client.Credential
		through, cursor uint64
		err             error
	}
	var acks []ackCall // the acker's, read once it ended
	toAck := make(chan client.Delivery, 1024)
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		for d := range toAck {
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			cur, err := readers.Ack(actx, d.Credential, d.Seq)
			cancel()
			acks = append(acks, ackCall{d.Credential, d.Seq, cur, err})
		}
	}()
	go func() {
		defer close(readDone)
		defer close(toAck)
		n := 0
		for d := range readers.Deliveries() {
			delMu.Lock()
			got[d.Conversation] = append(got[d.Conversation], d)
			delMu.Unlock()
			if n++; n%3 == 0 {
				select {
				case toAck <- d:
				default:
				}
			}
		}
	}()

	rng := rand.New(rand.NewPCG(seed, 0x6e656d))
	// A pause: node 0 neither applies nor answers the requests numbered
	// pauseFrom to pauseFrom+pauseLen of the run (a SIGSTOPped process);
	// a Cluster goes to node 1 meanwhile.
	requests, pauseFrom, pauseLen := 0, 20+rng.IntN(40), 10+rng.IntN(20)
	srv.setHook(func(fc *fconn, m wire.Message) action {
		if requests++; fc.node == 0 && requests >= pauseFrom && requests < pauseFrom+pauseLen {
			return hang
		}
		act, code := nemesisFault(rng, cluster, m)
		if act == backlogFull && committedLocked(srv, m) {
			// backlog_full comes after the token check: a committed
			// token replays.
			act = pass
		}
		if act == refuse {
			srv.refusal = wire.Error{Code: code, Detail: "nemesis"}
			if code == wire.CodeMoved {
				owner := addrs[1-fc.node]
				srv.refusal.Owner = &owner
			}
		}
		return act
	})

	// The traffic: per conversation, tells (one in eight too large),
	// then conversation 1's writer detaches and 2's leaves.
	tellsPer := 30
	if testing.Short() {
		tellsPer = 15
	}
	var callsMu sync.Mutex
	var calls []*ncall
	var wg sync.WaitGroup
	for i, conv := range convs {
		wrng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			do := func(c *ncall, f func(ctx context.Context, opt client.CallOption) (uint64, error)) {
				c.tok = client.NewToken()
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				defer cancel()
				c.start = time.Now()
				c.seq, c.err = f(cctx, client.WithToken(c.tok))
				c.end = time.Now()
				callsMu.Lock()
				calls = append(calls, c)
				callsMu.Unlock()
			}
			w := wcred[conv]
			for range tellsPer {
				size := 1 + wrng.IntN(16)
				if wrng.IntN(8) == 0 {
					size = 17 + wrng.IntN(32)
				}
				payload := make([]byte, size)
				do(&ncall{op: "tell", cred: w, oversized: size > 16}, func(ctx context.Context, opt client.CallOption) (uint64, error) {
					return writers.Tell(ctx, w, payload, opt)
				})
			}
			if conv == 1 {
				do(&ncall{op: "detach", cred: w}, func(ctx context.Context, opt client.CallOption) (uint64, error) {
					return writers.Detach(ctx, w, opt)
				})
			} else {
				do(&ncall{op: "leave", cred: w}, func(ctx context.Context, opt client.CallOption) (uint64, error) {
					return writers.Leave(ctx, w, opt)
				})
			}
		}()
	}
	traffic := make(chan struct{})
	go func() { wg.Wait(); close(traffic) }()
	select {
	case <-traffic:
	case <-ctx.Done():
		t.Fatal("a call is stuck past its context")
	}
	srv.setHook(nil)

	// Every record addressed to each reader reaches it once, in order,
	// once the faults stop.
	want := func() map[uint64][]uint64 {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		out := map[uint64][]uint64{}
		for _, conv := range convs {
			for _, rec := range srv.convs[conv].records {
				if rec.to[rcred[conv].Participant] {
					out[conv] = append(out[conv], rec.d.Seq)
				}
			}
		}
		return out
	}
	have := func() map[uint64][]uint64 {
		delMu.Lock()
		defer delMu.Unlock()
		out := map[uint64][]uint64{}
		for conv, ds := range got {
			for _, d := range ds {
				out[conv] = append(out[conv], d.Seq)
			}
		}
		return out
	}
	for tick := time.NewTicker(5 * time.Millisecond); ; {
		w, h := want(), have()
		if fmt.Sprint(w) == fmt.Sprint(h) {
			tick.Stop()
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			// Where the server holds each reader's binding, to tell a
			// reader nobody binds (the client's doing) from a slow one.
			bound := map[uint64]string{}
			srv.mu.Lock()
			for _, conv := range convs {
				bound[conv] = "unbound"
				if m := srv.convs[conv].members[rcred[conv].Participant]; m.bound != nil {
					bound[conv] = fmt.Sprintf("node %d", m.bound.node)
				}
			}
			srv.mu.Unlock()
			t.Fatalf("seed %d: the readers got %v, want %v (every record addressed to them, once, in order); bindings %v", seed, h, w, bound)
		}
	}

	checkCalls(t, srv, calls, seed)
	outcomes := map[string]int{}
	for _, c := range calls {
		var e *client.Error
		switch {
		case c.err == nil:
			outcomes["success"]++
		case errors.As(c.err, &e):
			outcomes[string(e.Code)]++
		default:
			outcomes["other"]++
		}
	}
	t.Logf("seed %d: outcomes %v", seed, outcomes)
	srv.mu.Lock()
	if m := srv.convs[1].members[wcred[1].Participant]; detachedOK(calls) && m.bound != nil {
		t.Errorf("seed %d: conversation 1's writer detached (answered) is bound again at generation %d", seed, m.gen)
	}
	srv.mu.Unlock()
	lostMu.Lock()
	for _, l := range lost {
		t.Errorf("seed %d: OnLost(%s): no participant of this workload may be lost", seed, l)
	}
	lostMu.Unlock()
	readers.Close()
	<-readDone
	<-ackDone
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, a := range acks {
		cursor := srv.convs[a.cred.Conversation].members[a.cred.Participant].cursor
		switch {
		case errors.Is(a.err, client.ErrAckRegression):
			t.Errorf("seed %d: Ack(%v, %d) = %v; an ack the cursor passed is acked", seed, a.cred, a.through, a.err)
		case a.err != nil:
			// Not acked now (no binding here at the moment, the context
			// ended, ...): nothing done, the next ack covers it.
		case a.cursor < a.through || cursor < a.through:
			t.Errorf("seed %d: Ack(%v, %d) = cursor %d (the server's %d), want at least %d", seed, a.cred, a.through, a.cursor, cursor, a.through)
		}
	}
}

// callTimeout bounds each call of the workload; stuckGrace is how long
// past it a call may take to return (an attempt in flight ending).
const (
	callTimeout = 3 * time.Second
	stuckGrace  = 2 * time.Second
)

func detachedOK(calls []*ncall) bool {
	for _, c := range calls {
		if c.op == "detach" && c.err == nil {
			return true
		}
	}
	return false
}

// checkCalls checks every call's answer against the fake's history:
// success only for a token it committed (with the answered seq); in_doubt
// only when a request carrying the token reached the server or a
// connection ended while the call ran (a write may have been lost with
// it); any other refusal only for a token it never committed; a payload
// too large refused too_large (or ending with its context when no session
// welcomed the call), never sent.
func checkCalls(t *testing.T, srv *fakeServer, calls []*ncall, seed uint64) {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	seen := map[wire.Token]bool{}
	for _, m := range srv.requests {
		switch r := m.(type) {
		case *wire.Tell:
			seen[r.Token] = true
		case *wire.Detach:
			seen[r.Token] = true
		case *wire.Leave:
			seen[r.Token] = true
		}
	}
	for _, c := range calls {
		if d := c.end.Sub(c.start); d > callTimeout+stuckGrace {
			t.Errorf("seed %d: %s of %v took %v, past its context's %v", seed, c.op, c.cred, d, callTimeout)
		}
		p := srv.convs[c.cred.Conversation].members[c.cred.Participant]
		ans, committed := p.tokens[c.tok]
		what := fmt.Sprintf("seed %d: %s of %v (token %v) = %d, %v", seed, c.op, c.cred, c.tok, c.seq, c.err)
		switch {
		case c.oversized:
			// The limit is the welcome's: a call that had no session
			// before its context ended cannot check it, and ends with
			// the context's error, neither sent nor in doubt.
			noSession := errors.Is(c.err, context.DeadlineExceeded) && c.end.Sub(c.start) >= callTimeout
			if !errors.Is(c.err, client.ErrTooLarge) && !noSession || errors.Is(c.err, client.ErrInDoubt) || seen[c.tok] {
				t.Errorf("%s: want too_large (or, with no session for the whole call, its context's error), nothing sent (sent: %v)", what, seen[c.tok])
			}
		case c.err == nil:
			if !committed {
				t.Errorf("%s: success, but the token never committed", what)
				continue
			}
			var seq uint64
			switch a := ans.(type) {
			case *wire.Told:
				seq = a.Seq
			case *wire.Detached:
				seq = a.Seq
			case *wire.Left:
				seq = a.Seq
			}
			if seq != c.seq {
				t.Errorf("%s: committed at seq %d", what, seq)
			}
		case errors.Is(c.err, client.ErrInDoubt):
			ended := slices.ContainsFunc(srv.ends, func(e time.Time) bool { return !e.Before(c.start) && !e.After(c.end) })
			if !seen[c.tok] && !ended {
				t.Errorf("%s: in_doubt, but no request of it reached the server and no connection ended meanwhile", what)
			}
		default:
			if committed {
				t.Errorf("%s: refused, but the token committed (%T)", what, ans)
			}
		}
	}
}

// committedLocked reports whether m's token is committed. srv.mu is held.
func committedLocked(srv *fakeServer, m wire.Message) bool {
	var conv, part uint64
	var tok wire.Token
	switch r := m.(type) {
	case *wire.Tell:
		conv, part, tok = r.Conversation, r.Participant, r.Token
	case *wire.Detach:
		conv, part, tok = r.Conversation, r.Participant, r.Token
	case *wire.Leave:
		conv, part, tok = r.Conversation, r.Participant, r.Token
	case *wire.Attach:
		conv, part, tok = r.Conversation, r.Participant, r.Token
	default:
		return false
	}
	cv := srv.convs[conv]
	if cv == nil || part >= uint64(len(cv.members)) {
		return false
	}
	_, ok := cv.members[part].tokens[tok]
	return ok
}
