package client

import (
	"context"
	"errors"

	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultAttemptTimeout is the default ClusterOptions.AttemptTimeout.
const DefaultAttemptTimeout = 3 * time.Second

// ClusterOptions configures a Cluster. The zero value means the defaults.
type ClusterOptions struct {
	// Options configures the Client of every node.
	Options
	// AttemptTimeout bounds one attempt of an operation on one node: past
	// it the node counts as unreachable and the operation is tried again,
	// with the same token, on another. Default DefaultAttemptTimeout.
	AttemptTimeout time.Duration
}

// Cluster is a client of a participantd cluster (docs/DESIGN.md, "Cluster
// mode"). It keeps one Client per node it needs and routes each
// conversation to the node that owns it, following moved: an operation
// answered moved{owner} is sent again to the owner with the same token, and
// a participant whose conversation moved is attached on its new owner with
// its latest credential before its bound operations are sent there. A node
// that cannot be reached (the owner named by moved may have just died) is
// skipped: the operation goes to the next seed, with backoff, until the
// conversation's new owner serves it.
//
// The guarantees of Client hold across nodes: every operation keeps one
// token on every node it is tried on, so it is applied at most once.
//
// A Cluster owns its Clients and one goroutine per Client that forwards
// deliveries; Close stops them all.
type Cluster struct {
	seeds []string
	opts  ClusterOptions
	log   zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	out    chan Delivery

	// mu guards the fields below. Never held across I/O.
	mu      sync.Mutex
	clients map[string]*Client
	// routes is the node last known to own each conversation.
	routes map[uint64]string
	// holders is the node whose Client holds each participant's binding.
	holders map[key]string
	// creds is the latest credential of each participant held.
	creds  map[key]Credential
	seen   map[uint64]uint64 // conversation -> highest seq delivered
	next   int               // seed rotation
	closed bool
}

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
		seeds:   append([]string(nil), seeds...),
		opts:    opts,
		log:     opts.Logger.With().Str("component", "client-cluster").Logger(),
		out:     make(chan Delivery, opts.DeliveryBuffer),
		clients: make(map[string]*Client),
		routes:  make(map[uint64]string),
		holders: make(map[key]string),
		creds:   make(map[key]Credential),
		seen:    make(map[uint64]uint64),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var first error
	for range seeds {
		if _, err := c.clientFor(ctx, c.nextSeed()); err == nil {
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
	dctx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	cl, err := Dial(dctx, addr, c.opts.Options)
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
func (c *Cluster) forward(cl *Client) {
	defer c.wg.Done()
	for d := range cl.Deliveries() {
		c.mu.Lock()
		// A compacted notice carries no seq of its own: never a repeat.
		dup := d.Kind != KindCompacted && d.Seq <= c.seen[d.Conversation]
		if !dup && d.Kind != KindCompacted {
			c.seen[d.Conversation] = d.Seq
		}
		c.mu.Unlock()
		if dup {
			continue
		}
		select {
		case c.out <- d:
		case <-c.ctx.Done():
			return
		}
	}
}

// attempt is one try of an operation on the node at addr.
type attempt func(ctx context.Context, addr string, cl *Client) error

// run tries op on conversation conv's owner until it is answered by the
// owner, following moved and skipping unreachable nodes. When ctx ends
// after a token-bearing request may have been applied, the error is an
// in_doubt *Error carrying the token.
func (c *Cluster) run(ctx context.Context, conv uint64, tok *Token, op attempt) error {
	b := backoff{min: c.opts.MinBackoff, max: c.opts.MaxBackoff}
	c.mu.Lock()
	addr := c.routes[conv]
	c.mu.Unlock()
	sent := false
	wait := func() bool { return sleep(ctx, b.next(), c.ctx.Done()) }
	for {
		if addr == "" {
			addr = c.nextSeed()
		}
		cl, err := c.clientFor(ctx, addr)
		if errors.Is(err, ErrClosed) {
			return ErrClosed
		}
		if err != nil {
			var rej *RejectedError
			if errors.As(err, &rej) && rej.Reason != "shutting_down" && rej.Reason != "overloaded" {
				return err
			}
			c.log.Debug().Err(err).Str("addr", addr).Msg("node unreachable; trying another")
			addr = ""
			if !wait() {
				return c.ended(ctx, sent, tok)
			}
			continue
		}
		actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
		err = op(actx, addr, cl)
		cancel()
		sent = true
		var e *Error
		switch {
		case err == nil:
			c.mu.Lock()
			c.routes[conv] = addr
			c.mu.Unlock()
			return nil
		case ctx.Err() != nil || errors.Is(err, ErrClosed):
			return c.ended(ctx, sent, tok)
		case errors.As(err, &e) && e.Code == CodeMoved:
			addr = e.Owner
			c.mu.Lock()
			c.routes[conv] = addr
			c.mu.Unlock()
			if addr == "" && !wait() {
				return c.ended(ctx, sent, tok)
			}
		case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &e) && (e.Code == CodeInDoubt || e.Code == CodeShuttingDown):
			// The node did not answer in time, or is going away: the
			// same token goes to another node.
			addr = ""
			if !wait() {
				return c.ended(ctx, sent, tok)
			}
		case errors.Is(err, errRebind), errors.As(err, &e) && e.Code == CodeUnavailable:
			if !wait() {
				return c.ended(ctx, sent, tok)
			}
		default:
			return err
		}
	}
}

func (c *Cluster) ended(ctx context.Context, sent bool, tok *Token) error {
	err := ctx.Err()
	if err == nil {
		err = ErrClosed
	}
	if !sent || tok == nil {
		return err
	}
	return &Error{Code: CodeInDoubt, Detail: "outcome unknown: " + err.Error(), Token: *tok, err: err}
}

// latest returns the newest credential known for cred's participant: the
// highest generation of cred itself (a caller may present one newer than
// any this Cluster saw: the credential another session saved), the
// recorded one and the holder Client's (its re-attachments change it).
func (c *Cluster) latest(cred Credential) Credential {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cred.key()
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

// hold records that the Client at addr now holds cred's binding, and makes
// the previous holder forget the participant.
func (c *Cluster) hold(cred Credential, addr string) {
	c.mu.Lock()
	k := cred.key()
	prev := c.holders[k]
	c.holders[k], c.creds[k] = addr, cred
	old := c.clients[prev]
	c.mu.Unlock()
	if prev != addr && old != nil {
		old.forget(cred)
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

// checkBound turns no_binding into errRebind, forgetting the holder.
func (c *Cluster) checkBound(err error, cred Credential, addr string) error {
	if !errors.Is(err, ErrNoBinding) {
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
// there (with its latest credential) when it does not.
func (c *Cluster) bindOn(ctx context.Context, addr string, cl *Client, cred Credential) (Credential, error) {
	cur := c.latest(cred)
	if c.holder(cred) == addr {
		return cur, nil
	}
	nc, err := cl.Attach(ctx, cur)
	if err != nil {
		return Credential{}, err
	}
	c.hold(nc, addr)
	return nc, nil
}

// Enroll is Client.Enroll on the conversation's owner.
func (c *Cluster) Enroll(ctx context.Context, conv uint64, opts ...CallOption) (Credential, error) {
	tok := tokenOf(opts)
	var cred Credential
	err := c.run(ctx, conv, &tok, func(ctx context.Context, addr string, cl *Client) error {
		// The caller's options (an invitation, say) go along; the token is
		// the one minted here, kept for every node the enroll is tried on.
		cr, err := cl.Enroll(ctx, conv, append(append([]CallOption(nil), opts...), WithToken(tok))...)
		if err == nil {
			cred = cr
			c.hold(cr, addr)
		}
		return err
	})
	return cred, err
}

// Attach is Client.Attach on the conversation's owner, with its options
// (WithToken) on every node it is tried on.
func (c *Cluster) Attach(ctx context.Context, cred Credential, opts ...CallOption) (Credential, error) {
	var out Credential
	err := c.run(ctx, cred.Conversation, nil, func(ctx context.Context, addr string, cl *Client) error {
		nc, err := cl.Attach(ctx, c.latest(cred), opts...)
		if err == nil {
			out = nc
			c.hold(nc, addr)
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
	err := c.run(ctx, cred.Conversation, &tok, func(ctx context.Context, addr string, cl *Client) error {
		cur, err := c.bindOn(ctx, addr, cl, cred)
		if err != nil {
			return err
		}
		seq, err = cl.Tell(ctx, cur, payload, WithToken(tok))
		return c.checkBound(err, cred, addr)
	})
	return seq, err
}

// Ack is Client.Ack on the conversation's owner.
func (c *Cluster) Ack(ctx context.Context, cred Credential, through uint64) (uint64, error) {
	var cursor uint64
	err := c.run(ctx, cred.Conversation, nil, func(ctx context.Context, addr string, cl *Client) error {
		cur, err := c.bindOn(ctx, addr, cl, cred)
		if err != nil {
			return err
		}
		cursor, err = cl.Ack(ctx, cur, through)
		return c.checkBound(err, cred, addr)
	})
	return cursor, err
}

// Detach is Client.Detach on the conversation's owner.
func (c *Cluster) Detach(ctx context.Context, cred Credential, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	var seq uint64
	err := c.run(ctx, cred.Conversation, &tok, func(ctx context.Context, addr string, cl *Client) error {
		cur, err := c.bindOn(ctx, addr, cl, cred)
		if err != nil {
			return err
		}
		seq, err = cl.Detach(ctx, cur, WithToken(tok))
		return c.checkBound(err, cred, addr)
	})
	return seq, err
}

// Leave is Client.Leave on the conversation's owner.
func (c *Cluster) Leave(ctx context.Context, cred Credential, opts ...CallOption) (uint64, error) {
	tok := tokenOf(opts)
	var seq uint64
	err := c.run(ctx, cred.Conversation, &tok, func(ctx context.Context, addr string, cl *Client) error {
		var err error
		seq, err = cl.Leave(ctx, c.latest(cred), WithToken(tok))
		return err
	})
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
// moved to another node, so this connection must not re-attach it.
func (c *Client) forget(cred Credential) {
	c.mu.Lock()
	delete(c.members, cred.key())
	c.mu.Unlock()
}
