package robustness_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/participantd/participantd/client"
)

// Outcome is what a client learned of one attempt of an operation.
type Outcome string

// Outcomes. A refusal means nothing was done (every error answer but
// in_doubt); unknown means the attempt may or may not have committed.
const (
	Answered Outcome = "answered"
	Refused  Outcome = "refused"
	Unknown  Outcome = "unknown"
	Lost     Outcome = "lost" // the client lost the participant (a *LostError)
)

// Op is one attempt of one operation, as a client saw it: the history the
// checker judges. Times are milliseconds since the run began.
type Op struct {
	Client       string  `json:"client"`
	Kind         string  `json:"kind"` // enroll, tell, replay
	Conversation uint64  `json:"conversation"`
	Participant  uint64  `json:"participant,omitempty"`
	Token        string  `json:"token,omitempty"`
	Payload      string  `json:"payload,omitempty"`
	Attempt      int     `json:"attempt,omitempty"`
	Start        int64   `json:"start_ms"`
	End          int64   `json:"end_ms"`
	Outcome      Outcome `json:"outcome"`
	Seq          uint64  `json:"seq,omitempty"`
	Err          string  `json:"error,omitempty"`
	Code         string  `json:"code,omitempty"` // the server's error code, if it answered one
}

// failed records err, the attempt's error, if any.
func (op *Op) failed(err error) {
	if err == nil {
		return
	}
	op.Err = err.Error()
	var e *client.Error
	if errors.As(err, &e) {
		op.Code = string(e.Code)
	}
}

// Delivery is one record a reader received.
type Delivery struct {
	Reader       string `json:"reader"`
	Conversation uint64 `json:"conversation"`
	Recipient    uint64 `json:"recipient"`
	Seq          uint64 `json:"seq"`
	Kind         string `json:"kind"`
	Participant  uint64 `json:"participant"`
	Payload      string `json:"payload,omitempty"`
	At           int64  `json:"at_ms"`
}

// history is every client's record of a run; safe for concurrent use.
type history struct {
	began time.Time

	mu         sync.Mutex
	ops        []Op
	deliveries []Delivery
	delivered  chan struct{} // signalled (non-blocking) on every delivery
}

func newHistory() *history {
	return &history{began: time.Now(), delivered: make(chan struct{}, 1)}
}

func (h *history) ms(t time.Time) int64 { return t.Sub(h.began).Milliseconds() }

func (h *history) add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

func (h *history) deliver(d Delivery) {
	h.mu.Lock()
	h.deliveries = append(h.deliveries, d)
	h.mu.Unlock()
	select {
	case h.delivered <- struct{}{}:
	default:
	}
}

func (h *history) snapshot() ([]Op, []Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...), append([]Delivery(nil), h.deliveries...)
}

// outcomeOf classifies a call's error.
func outcomeOf(err error) Outcome {
	var lost *client.LostError
	var e *client.Error
	switch {
	case err == nil:
		return Answered
	case errors.As(err, &lost):
		return Lost
	case errors.As(err, &e) && e.Code != client.CodeInDoubt:
		return Refused
	default:
		// in_doubt, a context's end, a closed client.
		return Unknown
	}
}

// callTimeout bounds one call of a writer: the client retries within it
// (same token, following moved), then the writer retries the token.
const callTimeout = 10 * time.Second

// tokenAttempts is how often a writer sends one token whose outcome stays
// unknown before it gives the operation up.
const tokenAttempts = 3

// writer tells on one conversation through a client.Cluster of its own,
// one operation at a time, each with a token of its own that it resends
// until answered (or tokenAttempts). It enrolls a participant first, and
// again when the client loses it.
type writer struct {
	name string
	conv uint64
	hist *history
	cl   *client.Cluster
	// dial connects a new client: after a lost participant the old
	// client's connection may still hold a binding in the conversation
	// (binding_occupied for a new enroll on it).
	dial func(ctx context.Context) (*client.Cluster, error)

	cred    client.Credential
	bound   bool
	tokens  []sentTell // every tell answered, for the replay check
	counter int
}

type sentTell struct {
	cred    client.Credential
	tok     client.Token
	payload string
	seq     uint64
}

func (w *writer) enroll(ctx context.Context) bool {
	tok := client.NewToken()
	for attempt := 1; attempt <= tokenAttempts && ctx.Err() == nil; attempt++ {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		cred, err := w.cl.Enroll(cctx, w.conv, client.WithToken(tok))
		cancel()
		op := Op{Client: w.name, Kind: "enroll", Conversation: w.conv, Token: tok.String(), Attempt: attempt,
			Start: w.hist.ms(start), End: w.hist.ms(time.Now()), Outcome: outcomeOf(err)}
		op.failed(err)
		if err == nil {
			op.Participant = cred.Participant
		}
		w.hist.add(op)
		switch op.Outcome {
		case Answered:
			w.cred, w.bound = cred, true
			return true
		case Refused, Lost:
			return false
		}
	}
	return false
}

// run tells until ctx ends.
func (w *writer) run(ctx context.Context) {
	for ctx.Err() == nil {
		if !w.bound && !w.enroll(ctx) {
			if !pause(ctx, 200*time.Millisecond) {
				return
			}
			continue
		}
		w.counter++
		if w.counter%oversizedEvery == 0 {
			w.oversized(ctx)
			continue
		}
		payload := fmt.Sprintf("%s/%d", w.name, w.counter)
		tok := client.NewToken()
		for attempt := 1; attempt <= tokenAttempts; attempt++ {
			start := time.Now()
			// The last attempts run past ctx (bounded): a writer gives an
			// operation up only after resending it.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
			seq, err := w.cl.Tell(cctx, w.cred, []byte(payload), client.WithToken(tok))
			cancel()
			op := w.record("tell", tok, attempt, start, payload, seq, err)
			if op.Outcome == Answered {
				w.tokens = append(w.tokens, sentTell{w.cred, tok, payload, seq})
			}
			if op.Outcome == Lost {
				w.bound = false
				w.redial(ctx)
			}
			if op.Outcome != Unknown || ctx.Err() != nil {
				break
			}
		}
	}
}

// oversizedEvery is how often a writer's tell is larger than the
// server's max_record_bytes (its default, 512 KiB).
const oversizedEvery = 16

// oversizedPayload exceeds the server's default max_record_bytes.
var oversizedPayload = make([]byte, 512<<10+1)

// oversized tells a payload over max_record_bytes: the client must
// refuse it too_large before sending, once, never in doubt
// (InvTooLargeFinal).
func (w *writer) oversized(ctx context.Context) {
	tok := client.NewToken()
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	seq, err := w.cl.Tell(cctx, w.cred, oversizedPayload, client.WithToken(tok))
	cancel()
	w.record("oversized", tok, 1, start, fmt.Sprintf("%s/%d (%d bytes)", w.name, w.counter, len(oversizedPayload)), seq, err)
}

// detach detaches the writer's participant at the end of the traffic,
// resending its token until answered (or tokenAttempts): an answered
// detach must leave the participant detached (InvDetachHolds).
func (w *writer) detach(ctx context.Context) {
	if !w.bound {
		return
	}
	tok := client.NewToken()
	for attempt := 1; attempt <= tokenAttempts && ctx.Err() == nil; attempt++ {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		seq, err := w.cl.Detach(cctx, w.cred, client.WithToken(tok))
		cancel()
		if op := w.record("detach", tok, attempt, start, "", seq, err); op.Outcome != Unknown {
			return
		}
	}
}

// record adds to the history one attempt, started at start, of an
// operation of kind on the writer's participant with token tok, answered
// seq or err, and returns it.
func (w *writer) record(kind string, tok client.Token, attempt int, start time.Time, payload string, seq uint64, err error) Op {
	op := Op{Client: w.name, Kind: kind, Conversation: w.conv, Participant: w.cred.Participant,
		Token: tok.String(), Payload: payload, Attempt: attempt,
		Start: w.hist.ms(start), End: w.hist.ms(time.Now()), Outcome: outcomeOf(err), Seq: seq}
	op.failed(err)
	w.hist.add(op)
	return op
}

// redial replaces the writer's client with a new one, until ctx ends.
func (w *writer) redial(ctx context.Context) {
	for ctx.Err() == nil {
		cl, err := w.dial(ctx)
		if err == nil {
			w.cl.Close()
			w.cl = cl
			return
		}
		pause(ctx, 200*time.Millisecond)
	}
}

// replay resends every answered tell of the writer's current participant
// with its token: each must replay its seq (or be refused), never commit
// again.
func (w *writer) replay(ctx context.Context) {
	for _, s := range w.tokens {
		if s.cred.Participant != w.cred.Participant {
			continue // a participant the client lost: no binding to send on
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		seq, err := w.cl.Tell(cctx, w.cred, []byte(s.payload), client.WithToken(s.tok))
		cancel()
		op := Op{Client: w.name, Kind: "replay", Conversation: w.conv, Participant: s.cred.Participant,
			Token: s.tok.String(), Payload: s.payload, Start: w.hist.ms(start), End: w.hist.ms(time.Now()),
			Outcome: outcomeOf(err), Seq: seq}
		op.failed(err)
		w.hist.add(op)
		if op.Outcome == Lost {
			return // every other resend would fail the same way
		}
	}
}

// reader enrolls one participant on its conversation and then only reads
// its deliveries: it never sends another operation (no ack, no tell), so
// that it moves to a conversation's new owner only if the client does so
// by itself.
type reader struct {
	name string
	conv uint64
	hist *history
	cl   *client.Cluster

	participant uint64
}

func (r *reader) enroll(ctx context.Context) error {
	tok := client.NewToken()
	var err error
	for attempt := 1; attempt <= tokenAttempts; attempt++ {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		var cred client.Credential
		cred, err = r.cl.Enroll(cctx, r.conv, client.WithToken(tok))
		cancel()
		op := Op{Client: r.name, Kind: "enroll", Conversation: r.conv, Token: tok.String(), Attempt: attempt,
			Start: r.hist.ms(start), End: r.hist.ms(time.Now()), Outcome: outcomeOf(err), Participant: cred.Participant}
		op.failed(err)
		r.hist.add(op)
		if err == nil {
			r.participant = cred.Participant
			return nil
		}
	}
	return fmt.Errorf("reader %s: enroll: %w", r.name, err)
}

// read records deliveries until the client closes.
func (r *reader) read() {
	for d := range r.cl.Deliveries() {
		r.hist.deliver(Delivery{Reader: r.name, Conversation: d.Conversation, Recipient: d.Recipient, Seq: d.Seq,
			Kind: string(d.Kind), Participant: d.Participant, Payload: string(d.Payload), At: r.hist.ms(time.Now())})
	}
}

// pause waits d or until ctx ends; it reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
