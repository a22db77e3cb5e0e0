package participant

import (
	"context"
	"errors"
	"fmt"

	"github.com/participantd/participantd/store"
)

// CompactReport is what Compact did to a stopped server's store.
type CompactReport struct {
	// Checkpoints is how many checkpoints were written.
	Checkpoints int
	// Compacted is what was removed.
	Compacted Compacted
	// Skipped lists the conversations left alone: refused, or needing a
	// repair that only a server start makes.
	Skipped []Unloadable
}

// Compact checkpoints and compacts every registered conversation of a
// stopped server's store st, as the background checkpointer would, with
// opts' CheckpointRows (default 1 here: every conversation with a row past
// its checkpoint), CheckpointPassRows and Retain; NodeKey is not needed.
// It reconciles each conversation in dry run first and leaves alone those
// that would be refused or repaired; it does not advance the incarnation
// or end bindings (a start does that). st must implement store.Compactor.
func Compact(ctx context.Context, st store.DurableStore, opts Options) (CompactReport, error) {
	var rep CompactReport
	if _, ok := store.AsCompactor(st); !ok {
		return rep, fmt.Errorf("participant: compact: %w", store.ErrUnsupported)
	}
	if opts.CheckpointRows <= 0 {
		opts.CheckpointRows = 1
	}
	opts.withDefaults()
	s := &Service{
		st:      st,
		opts:    opts,
		own:     ownershipOf(&opts, st),
		log:     opts.Logger.With().Str("component", "participant").Logger(),
		pages:   pages{budget: newByteBudget(int64(opts.LoadBytes)), bytes: opts.ReadPageBytes, window: opts.BacklogWindowBytes},
		backlog: newBacklog(opts.MaxBacklogBytes, opts.BacklogWindowBytes, opts.backlogLimits()),
		convs:   make(map[ConversationID]*conversation),
		conns:   make(map[ConnID]*Conn),
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	defer s.cancel()
	ids, err := readRegistry(st)
	if err != nil {
		return rep, err
	}
	for _, id := range ids {
		r, err := reconcile(ctx, st, id, s.pages)
		var ref *refusal
		switch {
		case errors.As(err, &ref):
			rep.Skipped = append(rep.Skipped, Unloadable{Conversation: id, Class: ref.class, Reason: ref.reason})
			continue
		case err != nil:
			return rep, err
		case r.Deleted:
			continue
		case len(r.Repairs) > 0:
			rep.Skipped = append(rep.Skipped, Unloadable{Conversation: id, Class: "needs_repair",
				Reason: fmt.Sprintf("%d outbox rows to repair at the next start", len(r.Repairs))})
			continue
		}
		cv := s.newConversation(id, true)
		cv.mu.Lock()
		cv.setStateLocked(r.State)
		cv.mu.Unlock()
		s.convs[id] = cv
	}
	// Passes are bounded in rows; run them until they find nothing.
	for {
		n, err := s.CheckpointPass(ctx)
		rep.Checkpoints += n
		if err != nil || n == 0 {
			if err != nil {
				return rep, err
			}
			break
		}
	}
	for {
		got, err := s.CompactPass(ctx)
		rep.Compacted.Conversations += got.Conversations
		rep.Compacted.OplogRows += got.OplogRows
		rep.Compacted.OutboxRows += got.OutboxRows
		rep.Compacted.Receipts += got.Receipts
		rep.Compacted.Forgotten += got.Forgotten
		rep.Compacted.Deleted += got.Deleted
		if err != nil {
			return rep, err
		}
		if got.OplogRows == 0 && got.OutboxRows == 0 {
			break
		}
	}
	return rep, nil
}
