package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultAttemptTimeout is the default ClusterOptions.AttemptTimeout.
const DefaultAttemptTimeout = 3 * time.Second

// MaxMoved is how many moved answers in a row one operation of a Cluster
// follows before it returns the last (nothing was done): two nodes may
// name each other while a lease expires. The first is followed at once,
// the others after a backoff. Any other answer in between (a node
// unreachable, unavailable, ...) starts the count again; those are
// retried with backoff for as long as the call's context allows.
const MaxMoved = 16

// ClusterOptions configures a Cluster. The zero value means the defaults.
type ClusterOptions struct {
	// Options configures the Client of every node. Its OnLost is called
	// once for a participant the Cluster can no longer use, whichever
	// node's Client or follow-up attach found out.
	Options
	// AttemptTimeout bounds one attempt of an operation on one node: past
	// it the node counts as unreachable and the operation is tried again,
	// with the same token, on another. Default DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// OnFollow, if set, is called when a participant the Cluster holds
	// lost its binding without being lost (its node went away, drained,
	// or no longer owns its conversation) and the Cluster starts to
	// attach it on its conversation's owner, with why; and again, with a
	// nil error, once it is bound there. It is called without locks held
	// and must not call the Cluster.
	OnFollow func(cred Credential, why error)
	// OnWait, if set, is called when an operation (or a participant's
	// follow-up attach) cannot reach its conversation's owner and waits
	// for one, with the conversation and why: the owner's node cannot be
	// reached, or no node owns the conversation yet (a failover waits for
	// the old owner's lease to expire). Called once per operation that
	// has waited longer than a second, without locks held; it must not
	// call the Cluster.
	OnWait func(conversation uint64, why error)
}

// Cluster is a client of a participantd cluster (docs/DESIGN.md, "Cluster
// mode"). It keeps one Client per node it needs and routes each
// conversation to the node that owns it, following moved: an operation
// answered moved{owner} is sent again to the owner with the same token, and
// a participant whose conversation moved is attached on its new owner with
// its latest credential before its bound operations are sent there, at
// most MaxMoved times in a row per operation. A node that cannot be reached (the
// owner named by moved may have just died), does not answer in time, or
// answers that it cannot serve (unavailable: cut off from etcd, or its
// storage failing; shutting_down) is skipped: the operation goes to the
// next seed, with backoff, until the conversation's owner serves it.
//
// The guarantees of Client hold across nodes: every operation keeps one
// token on every node it is tried on, so it is applied at most once. An
// attach too: the Clients of a Cluster share one attach intent per
// participant (token and presented credential), whichever node it is sent
// to and whichever sends it (Attach, the attach before a bound operation
// on a new owner, a node Client's re-attachment after a reconnect), so an
// attach that committed on a node that died before answering replays on
// the new owner instead of being refused stale_authority.
//
// A participant the Cluster holds bound follows its conversation: when its
// binding ends without it being lost (its node's connection ended, the
// node drained and said bye, or it answered that it no longer owns the
// conversation), the Cluster attaches it on the conversation's owner by
// itself, with backoff and the latest credential, so that a reader that
// never sends keeps receiving after a failover. Deliveries resume from the
// durable cursor and are deduplicated on (conversation, recipient, seq) across nodes,
// so the application sees each once, in order. Detach, Leave and the
// participant's loss end the following.
//
// A Cluster owns its Clients, one goroutine per Client that forwards
// deliveries and one per participant it is re-attaching; Close stops them
// all.
type Cluster struct {
	seeds []string
	opts  ClusterOptions
	log   zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	out    chan Delivery

	// intents is the attach in doubt of each participant, shared by every
	// node's Client.
	intents *intents
	// turn is held (a value in it) by the one forwarder that dedups and
	// sends a delivery, so that deliveries of one conversation arriving
	// through two nodes' Clients reach out in seq order.
	turn chan struct{}

	// mu guards the fields below. Never held across I/O; taken before a
	// Client's mu, never after.
	mu      sync.Mutex
	clients map[string]*Client
	// routes is the node last known to own each conversation.
	routes map[uint64]string
	// holders is the node whose Client holds each participant's binding
	// on a live connection: set only while it does (hold), cleared when
	// that Client reports the binding gone (unbound).
	holders map[key]string
	// creds is the latest credential of each participant held.
	creds map[key]Credential
	// follow is each participant kept bound: attached again on its
	// conversation's owner after its binding ends, until Detach, Leave or
	// its loss. following marks those a follower goroutine runs for.
	follow    map[key]bool
	following map[key]bool
	handed    handedOn // deliveries forwarded, from every node, to drop repeats
	// opLocks serialize, per participant, a follower's attach with the
	// release of a Detach or Leave (lockOp): an entry lives while some
	// goroutine holds or waits for it, so that a participant the
	// Cluster forgot (left, detached, lost) costs nothing.
	opLocks map[key]*opLock
	next    int // seed rotation
	closed  bool

	// single is set, by DialCluster before it returns the Cluster and
	// never after, when the one seed answered as a single server (a
	// welcome without node): there is no owner to wait for, only the
	// server, and errors and OnWait say so.
	single bool
}

// SingleServer reports whether the Cluster was dialled to one address
// that answered as a single server, not a cluster node: a conversation
// has no owner to move to, so waiting for it is waiting for the server.
func (c *Cluster) SingleServer() bool { return c.single }

// DialCluster connects to the first seed that answers and returns a
// Cluster that connects to other nodes as moved answers name them. Seeds
// are wire addresses of any nodes of the cluster.
func DialCluster(ctx context.Context, seeds []string, opts ClusterOptions) (*Cluster, error) {
	if len(seeds) == 0 {
		return nil, errors.New("client: no seed address")
	}
	if opts.AttemptTimeout <= 0 {
		opts.AttemptTimeout = DefaultAttemptTimeout
	}
	opts.withDefaults()
	c := &Cluster{
		seeds:     append([]string(nil), seeds...),
		opts:      opts,
		log:       opts.Logger.With().Str("component", "client-cluster").Logger(),
		out:       make(chan Delivery, opts.DeliveryBuffer),
		clients:   make(map[string]*Client),
		routes:    make(map[uint64]string),
		holders:   make(map[key]string),
		creds:     make(map[key]Credential),
		follow:    make(map[key]bool),
		following: make(map[key]bool),
		handed:    newHandedOn(),
		opLocks:   make(map[key]*opLock),
		intents:   newIntents(),
		turn:      make(chan struct{}, 1),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var first error
	for range seeds {
		if cl, err := c.clientFor(ctx, c.nextSeed()); err == nil {
			c.single = len(seeds) == 1 && cl.Welcome().Node == ""
			return c, nil
		} else if first == nil {
			first = err
		}
	}
	c.Close()
	return nil, first
}

// Deliveries returns the deliveries of every node, deduplicated on
// (conversation, seq). It is closed by Close.
func (c *Cluster) Deliveries() <-chan Delivery { return c.out }

// Close closes every node's Client (each sends bye) and waits for them.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	clients := c.clients
	c.clients = map[string]*Client{}
	c.mu.Unlock()
	c.cancel()
	for _, cl := range clients {
		cl.Close()
	}
	c.wg.Wait()
	close(c.out)
	return nil
}

func (c *Cluster) nextSeed() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.seeds[c.next%len(c.seeds)]
	c.next++
	return s
}

// clientFor returns the Client of addr, dialing it if needed.
func (c *Cluster) clientFor(ctx context.Context, addr string) (*Client, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if cl := c.clients[addr]; cl != nil {
		c.mu.Unlock()
		return cl, nil
	}
	c.mu.Unlock()
	opts := c.opts.Options
	opts.OnLost = func(cred Credential, why error) { c.lose(cred, why) }
	dctx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	cl, err := dialClient(dctx, addr, opts, c.intents, func(cred Credential) { c.unbound(addr, cred) },
		func(cl *Client, cred Credential) { c.hold(cred, addr, cl, false) })
	cancel()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if other := c.clients[addr]; other != nil || c.closed {
		c.mu.Unlock()
		cl.Close()
		if other == nil {
			return nil, ErrClosed
		}
		return other, nil
	}
	c.clients[addr] = cl
	c.wg.Add(1)
	c.mu.Unlock()
	go c.forward(cl)
	return cl, nil
}

// forward moves cl's deliveries to the Cluster's channel, deduplicated.
// The dedup and the send happen in one turn, so that a delivery a dead
// node's Client still had queued cannot overtake, or follow, the same
// conversation's later deliveries through the new owner out of order.
func (c *Cluster) forward(cl *Client) {
	defer c.wg.Done()
	for d := range cl.Deliveries() {
		select {
		case c.turn <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		if c.fresh(d) {
			if d.Credential.Generation == 0 {
				// Its node's Client forgot the recipient (it moved to
				// another node): the Cluster's latest credential acks it.
				d.Credential = c.latest(Credential{Conversation: d.Conversation, Participant: d.Recipient})
			}
			select {
			case c.out <- d:
			case <-c.ctx.Done():
				<-c.turn
				return
			}
		}
		<-c.turn
	}
}

// fresh reports whether d is no repeat of a delivery forwarded already,
// and if so records it: its seq as the highest of its (conversation,
// recipient), or for a compacted notice its first.
func (c *Cluster) fresh(d Delivery) bool {
	n := d.Seq
	if d.Kind == KindCompacted {
		n = d.First
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handed.fresh(key{d.Conversation, d.Recipient}, d.Kind == KindCompacted, n)
}

// attempt is one try of an operation on the node at addr.
type attempt func(ctx context.Context, addr string, cl *Client) error

// waitNotice is how long an operation waits for its conversation's owner
// before OnWait tells the caller.
const waitNotice = time.Second

// run tries op on conversation conv's owner until it is answered by the
// owner, following moved (at most MaxMoved times in a row, with backoff
// from the second) and trying another node when one is unreachable, does not
// answer in time, or answers that it cannot serve (unavailable,
// shutting_down, in_doubt). st (a fresh one if nil) tracks whether a
// request carrying tok may have been applied: only then does a call
// that ends without its outcome (ctx, Close, the moved bound, a
// refusal that does not settle the token) return an in_doubt *Error
// carrying the token.
func (c *Cluster) run(ctx context.Context, conv uint64, tok *Token, st *sendState, op attempt) error {
	if st == nil {
		st = &sendState{}
	}
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	c.mu.Lock()
	addr := c.routes[conv]
	c.mu.Unlock()
	told, start, moved := false, time.Now(), 0
	// last is why the latest attempt did not get the operation done:
	// what a node answered, or why none could be asked. A caller whose
	// context ends while waiting learns it with the context's error.
	var last error
	wait := func(why error) bool {
		last = why
		if !told && c.opts.OnWait != nil && time.Since(start) >= waitNotice {
			told = true
			c.opts.OnWait(conv, why)
		}
		return sleep(ctx, b.next(), c.ctx.Done())
	}
	ended := func() error { return c.ended(ctx, st, tok, conv, last) }
	for {
		if addr == "" {
			addr = c.nextSeed()
		}
		cl, err := c.clientFor(ctx, addr)
		if errors.Is(err, ErrClosed) {
			return ended()
		}
		if err != nil {
			var rej *RejectedError
			if errors.As(err, &rej) && rej.Reason != "shutting_down" && rej.Reason != "overloaded" {
				return st.unknown(tok, err)
			}
			c.log.Debug().Err(err).Str("addr", addr).Msg("node unreachable; trying another")
			why := fmt.Errorf("node %s unreachable: %w", addr, err)
			addr = ""
			if !wait(why) {
				return ended()
			}
			continue
		}
		actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
		err = op(actx, addr, cl)
		cancel()
		st.answered(err)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeMoved {
			moved = 0 // the bound is on moved answers in a row
		}
		switch {
		case err == nil:
			c.mu.Lock()
			c.routes[conv] = addr
			c.mu.Unlock()
			return nil
		case ctx.Err() != nil || errors.Is(err, ErrClosed):
			return ended()
		case errors.As(err, &e) && e.Code == CodeMoved:
			if moved++; moved > MaxMoved {
				return st.unknown(tok, fmt.Errorf("%w (followed %d times)", err, MaxMoved))
			}
			from := addr
			addr = e.Owner
			c.mu.Lock()
			c.routes[conv] = addr
			c.mu.Unlock()
			switch {
			case addr == "":
				if !wait(fmt.Errorf("no node owns conversation %d yet (asked %s)", conv, from)) {
					return ended()
				}
			case moved > 1:
				// Nodes that name each other (a lease expiring) are
				// asked again only after a backoff.
				if !wait(fmt.Errorf("node %s says node %s owns conversation %d", from, addr, conv)) {
					return ended()
				}
			}
		case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &e) &&
			(e.Code == CodeInDoubt || e.Code == CodeShuttingDown || e.Code == CodeUnavailable):
			// The node did not answer in time, is going away, or cannot
			// serve (cut off from etcd, its storage failing): the same
			// token goes to another node, which may hold the
			// conversation's claim.
			why := fmt.Errorf("node %s: %w", addr, err)
			if errors.Is(err, context.DeadlineExceeded) {
				why = fmt.Errorf("node %s did not answer within %v", addr, c.opts.AttemptTimeout)
			}
			addr = ""
			if !wait(why) {
				return ended()
			}
		case errors.Is(err, errRebind), errors.Is(err, errForgotten):
			if !wait(fmt.Errorf("node %s: %w", addr, err)) {
				return ended()
			}
		default:
			return st.unknown(tok, err)
		}
	}
}

// ended is the error of an operation on conversation conv whose ctx ended,
// or whose Cluster closed, while it waited: ctx's error (or ErrClosed)
// with last, why it was waiting; an in_doubt *Error carrying the token
// when a token-bearing request may have been applied (st).
func (c *Cluster) ended(ctx context.Context, st *sendState, tok *Token, conv uint64, last error) error {
	err := ctx.Err()
	if err == nil {
		err = ErrClosed
	}
	switch {
	case last != nil && c.single:
		err = fmt.Errorf("%w (waiting for the server at %s: %v)", err, c.seeds[0], last)
	case last != nil:
		err = fmt.Errorf("%w (waiting for the owner of conversation %d: %v)", err, conv, last)
	}
	return st.unknown(tok, err)
}

// latest returns the newest credential known for cred's participant: the
// highest generation of cred itself (a caller may present one newer than
// any this Cluster saw: the credential another session saved), the
// recorded one, the holder Client's (its re-attachments change it) and
// the newest any node's Client learned.
func (c *Cluster) latest(cred Credential) Credential {
	k := cred.key()
	if cur, ok := c.intents.newestOf(k); ok && cur.Generation > cred.Generation {
		cred = cur
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.creds[k]; ok && cur.Generation > cred.Generation {
		cred = cur
	}
	if cl := c.clients[c.holders[k]]; cl != nil {
		if cur, ok := cl.Credential(k.conv, k.participant); ok && cur.Generation > cred.Generation {
			cred = cur
		}
	}
	return cred
}

// hold records that the Client cl, at addr, now holds cred's binding, and
// makes every other node's Client forget the participant; with want, the
// caller's operation bound it, and the Cluster keeps it bound from now on
// (follows it). Every Client of the Cluster calls it (its bound hook) for
// each binding it makes, its own re-attachments included: one made by a
// node's Client after a reconnect moves the binding there, and the
// Cluster follows the participant from where its binding is. A report of
// a generation older than one already reported is of a superseded
// binding, and changes nothing but want. When cl's connection holding it ended meanwhile, cl's
// report of the binding gone (unbound) may have come already: no holder
// is recorded, and the Cluster follows the participant as unbound would.
func (c *Cluster) hold(cred Credential, addr string, cl *Client, want bool) {
	k := cred.key()
	c.mu.Lock()
	if want {
		c.follow[k] = true
	}
	if cred.Generation < c.creds[k].Generation {
		// A report that comes after the report of a newer binding (its
		// Client's goroutine was slower: OnCredential runs before it) is
		// of a binding the newer one superseded: the newer hold already
		// made every other Client forget the participant, and took the
		// holder; taking them back would make the Client that holds the
		// binding forget it. Only a want it brings may start a follower,
		// when the newer binding has ended already.
		start := want && c.startFollowLocked(k)
		c.mu.Unlock()
		if start {
			c.followFrom(addr, cred)
		}
		return
	}
	c.creds[k] = cred
	// cl.boundLive takes cl.mu under c.mu: a binding seen live here is
	// reported gone by cl's supervisor only after, when c.mu is free, so
	// unbound never misses the holder recorded here.
	live := cl.boundLive(k)
	if live {
		c.holders[k] = addr
	}
	start := !live && c.startFollowLocked(k)
	var others []*Client
	for a, o := range c.clients {
		if a != addr {
			others = append(others, o)
		}
	}
	c.mu.Unlock()
	for _, o := range others {
		o.forget(cred)
	}
	if start {
		c.followFrom(addr, cred)
	}
}

func (c *Cluster) holder(cred Credential) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holders[cred.key()]
}

// errRebind reports a bound operation answered no_binding by a node the
// Cluster believed held the binding (the conversation moved away and back,
// and the binding was ended meanwhile): attach again, then retry.
var errRebind = errors.New("client: binding gone; attach again")

// checkBound turns no_binding into errRebind, forgetting the holder; and
// stale_authority too when the Cluster knows a newer credential than
// cur, the one presented, or an attach of the participant is in doubt:
// an attach of its own (on another node) moved the participant on, so
// the operation is sent again after attaching (which sends the attach in
// doubt again, with its token, and learns what it minted).
func (c *Cluster) checkBound(err error, cred, cur Credential, addr string) error {
	ours := errors.Is(err, ErrStaleAuthority) && !errors.Is(err, ErrParticipantLost) &&
		(c.latest(cred).Generation > cur.Generation || c.intents.inDoubt(cred.key()))
	if !errors.Is(err, ErrNoBinding) && !ours {
		return err
	}
	c.mu.Lock()
	if c.holders[cred.key()] == addr {
		delete(c.holders, cred.key())
	}
	c.mu.Unlock()
	return errRebind
}

// bindOn makes sure the Client at addr holds cred's binding, attaching it
// there (with its latest credential, and the participant's attach intent
// if one is in doubt on any node) when it does not; want as for hold.
func (c *Cluster) bindOn(ctx context.Context, addr string, cl *Client, cred Credential, want bool) (Credential, error) {
	cur := c.latest(cred)
	if c.holder(cred) == addr {
		return cur, nil
	}
	nc, err := cl.Attach(ctx, cur)
	if err != nil {
		return Credential{}, err
	}
	c.hold(nc, addr, cl, want)
	return nc, nil
}

// unbound is told by the Client at addr that the participant of cred is
// no longer bound by it: the Cluster follows it to its conversation's
// owner, if it keeps it bound.
func (c *Cluster) unbound(addr string, cred Credential) {
	k := cred.key()
	c.mu.Lock()
	if c.holders[k] == addr {
		delete(c.holders, k)
	}
	start := c.startFollowLocked(k)
	c.mu.Unlock()
	if start {
		c.followFrom(addr, cred)
	}
}

// startFollowLocked reports whether a follower of k must start (it is
// followed, held nowhere, and none runs), and if so counts it as running.
// c.mu is held.
func (c *Cluster) startFollowLocked(k key) bool {
	start := c.follow[k] && !c.following[k] && !c.closed && c.holders[k] == ""
	if start {
		c.following[k] = true
		c.wg.Add(1)
	}
	return start
}

// followFrom runs the follower of cred's participant, whose binding on
// addr is gone; startFollowLocked counted it.
func (c *Cluster) followFrom(addr string, cred Credential) {
	c.log.Info().Stringer("participant", cred).Str("from", addr).Msg("binding gone; following the conversation to its owner")
	if c.opts.OnFollow != nil {
		c.opts.OnFollow(cred, fmt.Errorf("client: binding on %s gone", addr))
	}
	go c.followLoop(cred.key())
}

// followLoop attaches the participant k on its conversation's owner until
// it is bound there (by it, or by an operation that attached it), no
// longer followed, lost, or Close. It is owned by c.wg; unbound starts it.
func (c *Cluster) followLoop(k key) {
	defer c.wg.Done()
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	for {
		c.mu.Lock()
		cred := c.creds[k]
		if c.closed || !c.follow[k] || c.holders[k] != "" {
			bound := !c.closed && c.follow[k]
			delete(c.following, k)
			c.mu.Unlock()
			if bound && c.opts.OnFollow != nil {
				c.opts.OnFollow(c.latest(cred), nil)
			}
			return
		}
		c.mu.Unlock()
		err := c.run(c.ctx, k.conv, nil, nil, func(ctx context.Context, addr string, cl *Client) error {
			// Under the participant's lockOp: a Detach or Leave releases
			// it either before this looks (and none is sent) or after
			// this attach ended (and its release unbinds nothing new).
			defer c.lockOp(k)()
			c.mu.Lock()
			want := c.follow[k]
			c.mu.Unlock()
			if !want { // Detach or Leave meanwhile
				return errUnfollowed
			}
			_, err := c.bindOn(ctx, addr, cl, cred, false)
			return err
		})
		// Each case goes round to the check above, which ends the loop
		// once Close ran: Close marks the Cluster closed before it
		// cancels c.ctx.
		switch {
		case err == nil, errors.Is(err, errUnfollowed), c.ctx.Err() != nil:
		case errors.Is(err, ErrParticipantLost):
			c.lose(c.latest(cred), err)
		default:
			c.log.Warn().Err(err).Stringer("participant", cred).Msg("following the conversation: attach refused; retrying")
			sleep(c.ctx, b.next(), nil)
		}
	}
}

// errUnfollowed stops a follower whose participant was detached or left.
var errUnfollowed = errors.New("client: participant no longer followed")

// lose records that the participant of cred is lost (why, a *LostError)
// and calls OnLost, once.
func (c *Cluster) lose(cred Credential, why error) {
	k := cred.key()
	c.mu.Lock()
	was := c.follow[k]
	delete(c.follow, k)
	delete(c.holders, k)
	c.mu.Unlock()
	if was && c.opts.OnLost != nil {
		c.opts.OnLost(cred, why)
	}
}

// opLock is the lock of one participant's opLocks entry; refs counts the
// goroutines that hold it or wait for it, guarded by Cluster.mu.
type opLock struct {
	mu   sync.Mutex
	refs int
}

// lockOp takes the lock that serializes a follower's attach of the
// participant k with the release of its Detach or Leave, and returns the
// function that gives it back. Every goroutine that wants it counts
// itself in the entry under c.mu before it waits, and the entry is
// dropped only by the last one to give it back: two goroutines that
// overlap always share one mutex, and none is kept for a participant
// nobody is serializing.
func (c *Cluster) lockOp(k key) (unlock func()) {
	c.mu.Lock()
	l := c.opLocks[k]
	if l == nil {
		l = new(opLock)
		c.opLocks[k] = l
	}
	l.refs++
	c.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		c.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(c.opLocks, k)
		}
		c.mu.Unlock()
	}
}

// release stops keeping the participant of cred bound (Detach, Leave;
// leaving for Leave), before their request is sent: no follower attaches
// it from now on (one in flight ends first), and no node's Client
// re-attaches it on its own (Client.release).
func (c *Cluster) release(cred Credential, leaving bool) {
	k := cred.key()
	defer c.lockOp(k)()
	c.mu.Lock()
	delete(c.follow, k)
	clients := make([]*Client, 0, len(c.clients))
	for _, cl := range c.clients {
		clients = append(clients, cl)
	}
	c.mu.Unlock()
	for _, cl := range clients {
		cl.release(k, leaving)
	}
}

// unhold forgets the holder of the participant of cred, which a Detach
// or Leave unbound.
func (c *Cluster) unhold(cred Credential) {
	c.mu.Lock()
	delete(c.holders, cred.key())
	c.mu.Unlock()
}

// Enroll is Client.Enroll on the conversation's owner.
func (c *Cluster) Enroll(ctx context.Context, conv uint64, opts ...CallOption) (Credential, error) {
	tok := tokenOf(opts)
	var cred Credential
	err := c.run(ctx, conv, &tok, nil, func(ctx context.Context, addr string, cl *Client) error {
		// The caller's options (an invitation, say) go along; the token is
		// the one minted here, kept for every node the enroll is tried on.
		cr, err := cl.Enroll(ctx, conv, append(append([]CallOption(nil), opts...), WithToken(tok))...)
		if err == nil {
			cred = cr
			c.hold(cr, addr, cl, true)
		}
		return err
	})
	return cred, err
}

// Attach is Client.Attach on the conversation's owner, with its options
// (WithToken) on every node it is tried on. The attach is one intended
// operation: its token and presented credential are the same on every
// node it is tried on.
func (c *Cluster) Attach(ctx context.Context, cred Credential, opts ...CallOption) (Credential, error) {
	var out Credential
	err := c.run(ctx, cred.Conversation, nil, nil, func(ctx context.Context, addr string, cl *Client) error {
		nc, err := cl.Attach(ctx, c.latest(cred), opts...)
		if err == nil {
			c.hold(nc, addr, cl, true)
			out = nc
		}
		return err
	})
	return out, err
}

// Tell is Client.Tell on the conversation's owner, attaching the
// participant there first if its binding is on another node.
func (c *Cluster) Tell(ctx context.Context, cred Credential, payload []byte, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	var seq uint64
	err := c.runBound(ctx, cred, &tok, func(ctx context.Context, cl *Client, cur Credential) (err error) {
		seq, err = cl.Tell(ctx, cur, payload, WithToken(tok))
		return err
	})
	return seq, err
}

// Ack is Client.Ack on the conversation's owner.
func (c *Cluster) Ack(ctx context.Context, cred Credential, through uint64) (uint64, error) {
	var cursor uint64
	err := c.runBound(ctx, cred, nil, func(ctx context.Context, cl *Client, cur Credential) (err error) {
		cursor, err = cl.Ack(ctx, cur, through)
		return err
	})
	return cursor, err
}

// Detach is Client.Detach on the conversation's owner. The Cluster
// stops keeping the participant bound before anything is sent, whatever
// the outcome (release). Until a request of the detach may have been
// applied, the participant is attached first on a node that does not
// hold its binding (a detach needs it), and let go of again on that node
// when the detach is not sent there; after, the detach is resent as
// it is, with its token, to whichever node owns the conversation: it
// replays if it committed, and is refused no_binding if not (the binding
// ended with its node's connection; nothing was detached).
func (c *Cluster) Detach(ctx context.Context, cred Credential, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	c.release(cred, false)
	var seq uint64
	var st sendState
	err := c.run(ctx, cred.Conversation, &tok, &st, func(ctx context.Context, addr string, cl *Client) (err error) {
		if st.maybe {
			seq, err = cl.Detach(ctx, c.latest(cred), WithToken(tok))
			return err
		}
		cur, err := c.bindOn(ctx, addr, cl, cred, false)
		if err != nil {
			// Its attach made cl want the participant bound (as any
			// Attach does); the detach goes on elsewhere, and cl's next
			// connection must not bind it again once it committed.
			cl.release(cred.key(), false)
			return err
		}
		seq, err = cl.Detach(ctx, cur, WithToken(tok))
		return c.checkBound(err, cred, cur, addr)
	})
	if err == nil {
		c.unhold(cred)
	}
	return seq, err
}

// runBound runs op, an operation that needs the binding of cred's
// participant, on the conversation's owner (run, with tok): on each node
// tried, the participant is bound there first (bindOn, and followed from
// then on), and op gets that node's Client and the credential to present;
// a no_binding answer from the node believed to hold the binding makes
// run attach it again and retry (checkBound).
func (c *Cluster) runBound(ctx context.Context, cred Credential, tok *Token, op func(ctx context.Context, cl *Client, cur Credential) error) error {
	return c.run(ctx, cred.Conversation, tok, nil, func(ctx context.Context, addr string, cl *Client) error {
		cur, err := c.bindOn(ctx, addr, cl, cred, true)
		if err != nil {
			return err
		}
		return c.checkBound(op(ctx, cl, cur), cred, cur, addr)
	})
}

// Leave is Client.Leave on the conversation's owner. The Cluster stops
// keeping the participant bound before anything is sent (release), so a
// follower's attach neither races the leave's credential nor reports
// the participant lost once it left.
func (c *Cluster) Leave(ctx context.Context, cred Credential, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	c.release(cred, true)
	var seq uint64
	err := c.run(ctx, cred.Conversation, &tok, nil, func(ctx context.Context, addr string, cl *Client) error {
		var err error
		seq, err = cl.Leave(ctx, c.latest(cred), WithToken(tok))
		return err
	})
	if err == nil {
		c.unhold(cred)
		c.intents.forget(cred.key())
	}
	return seq, err
}

// Credential returns the latest credential the Cluster holds for the
// participant.
func (c *Cluster) Credential(conversation, participant uint64) (Credential, bool) {
	c.mu.Lock()
	_, ok := c.creds[key{conversation, participant}]
	c.mu.Unlock()
	if !ok {
		return Credential{}, false
	}
	return c.latest(Credential{Conversation: conversation, Participant: participant}), true
}

// forget drops the participant of cred from this Client: its conversation
// moved to another node, so this connection must not re-attach it. In a
// Cluster its attach in doubt, if any, stays in the shared intents table:
// the Cluster sends it to the new owner. A plain Client drops it with the
// participant, since nothing of the Client sends it again; an Attach of
// the participant later starts a new intent (safe, as an attach presents
// a credential: if an earlier send committed, the new one is refused
// stale_authority, never applied twice).
func (c *Client) forget(cred Credential) {
	c.mu.Lock()
	delete(c.members, cred.key())
	c.mu.Unlock()
	if c.unbound == nil {
		c.intents.dropPending(cred.key())
	}
}

// boundLive reports whether the Client holds k bound on a live
// connection.
func (c *Client) boundLive(k key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[k]
	return m != nil && m.lost == nil && m.sess != nil && m.sess.alive()
}
