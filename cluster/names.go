package cluster

import (
	"errors"
	"fmt"
	"strings"

	"github.com/participantd/participantd/checkpoint"
	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/receipt"
	"github.com/participantd/participantd/registry"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
	"github.com/participantd/participantd/tokenindex"
)

// ordinalShift places a node's ordinal above its own start counter in the
// incarnation the participant sees (see Store).
const ordinalShift = 40

// Scope maps the participant's store names to scopes: every name of
// conversation c (its oplog and outbox streams, its token index, its
// checkpoint and its receipts) maps to c's decimal id, so that one
// conversation is one key range and one fence; every other name is global.
func Scope(name string) string {
	var rest string
	switch {
	case strings.HasPrefix(name, "oplog/"):
		rest = name[len("oplog/"):]
	case strings.HasPrefix(name, outbox.StreamPrefix):
		rest = name[len(outbox.StreamPrefix):]
	case strings.HasPrefix(name, checkpoint.KeyPrefix):
		rest = name[len(checkpoint.KeyPrefix):]
	case strings.HasPrefix(name, tokenindex.Prefix), strings.HasPrefix(name, receipt.KeyPrefix):
		rest = name[strings.IndexByte(name, '/')+1:]
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return ""
		}
		rest = rest[:i]
	default:
		return ""
	}
	if rest == "" || len(rest) > 20 || strings.Trim(rest, "0123456789") != "" {
		return ""
	}
	return rest
}

// ScanScope reports whether every name that begins with prefix has
// prefix's own scope (Scope(prefix)): a prefix of the token index or the
// receipts that runs through the conversation's id and the '/' after it
// (tokenindex.ConversationPrefix), whose names all map to that
// conversation. Any other prefix (an oplog stream's "oplog/1" also begins
// "oplog/12") is reported false.
func ScanScope(prefix string) bool {
	for _, p := range []string{tokenindex.Prefix, receipt.KeyPrefix} {
		rest, ok := strings.CutPrefix(prefix, p)
		if ok && strings.IndexByte(rest, '/') >= 0 {
			return true
		}
	}
	return false
}

// scopeOf returns the scope of conversation c.
func scopeOf(c participant.ConversationID) string {
	return Scope(oplog.Stream(c))
}

// Store is the DurableStore a clustered participant.Service runs on: the
// etcd store with the service's two global names made per node, so that no
// two nodes ever write one shared stream or value.
//
//	participant name         stored as
//	server/incarnation       node/<id>/incarnation (this node's starts)
//	conversations            node/<id>/conversations
//
// The incarnation the service reads is the node's ordinal (unique in the
// cluster, assigned once per node id) shifted left by 40 bits plus the
// node's own start count, so that connection ids, which carry it, never
// collide between nodes while each node counts its own starts.
type Store struct {
	*etcdstore.Store
	ordinal     uint64
	incarnation string
	registry    string
}

func newStore(st *etcdstore.Store, nodeID string, ordinal uint64) *Store {
	return &Store{
		Store:       st,
		ordinal:     ordinal,
		incarnation: "node/" + nodeID + "/incarnation",
		registry:    "node/" + nodeID + "/conversations",
	}
}

var (
	_ store.DurableStore = (*Store)(nil)
	_ store.Compactor    = (*Store)(nil)
	_ store.PageReader   = (*Store)(nil)
)

func (s *Store) rename(name string) string {
	switch name {
	case participant.IncarnationKey:
		return s.incarnation
	case registry.Stream:
		return s.registry
	}
	return name
}

const localMask = 1<<ordinalShift - 1

// ConversationError is the sticky failure of one conversation's scope
// (a fence lost, a commit whose outcome is unknown, a compare that failed),
// as the service sees it: it concerns that conversation only, so it does
// not match store.ErrFailed (which would fail the whole service), while it
// matches the etcdstore sentinel it carries (etcdstore.ErrFenced,
// ErrUnknownOutcome or ErrConflict). The conversation's next grant
// (Node.Acquire) resets the scope, and the service reconciles it from etcd.
type ConversationError struct {
	// Scope is the failed conversation's scope, "" when a store-wide Flush
	// reported it (the wrapped error names it).
	Scope string
	err   error
}

func (e *ConversationError) Error() string {
	if e.Scope == "" {
		return fmt.Sprintf("cluster: a conversation failed: %v", e.err)
	}
	return fmt.Sprintf("cluster: conversation %s failed: %v", e.Scope, e.err)
}

// Is matches what the scope's error matches, except store.ErrFailed.
func (e *ConversationError) Is(target error) bool {
	return target != store.ErrFailed && errors.Is(e.err, target)
}

// scoped returns err as the service must see it from a call on name: the
// failure of a conversation's scope as a *ConversationError; any other
// error (the global scope's failure included, which does fail the node)
// unchanged.
func (s *Store) scoped(name string, err error) error {
	if err == nil || !errors.Is(err, store.ErrFailed) {
		return err
	}
	sc := s.Store.ScopeOf(name)
	if sc == "" {
		return err
	}
	return &ConversationError{Scope: sc, err: err}
}

// Append appends to the (renamed) stream.
func (s *Store) Append(name string, payload []byte, expectedSeq uint64) (uint64, error) {
	name = s.rename(name)
	seq, err := s.Store.Append(name, payload, expectedSeq)
	return seq, s.scoped(name, err)
}

// ReadFrom reads the (renamed) stream.
func (s *Store) ReadFrom(name string, offset uint64, limit int) ([]store.Entry, error) {
	name = s.rename(name)
	es, err := s.Store.ReadFrom(name, offset, limit)
	return es, s.scoped(name, err)
}

// ReadPage reads a page of the (renamed) stream (store.PageReader).
func (s *Store) ReadPage(name string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	name = s.rename(name)
	es, err := s.Store.ReadPage(name, offset, limit, maxBytes)
	return es, s.scoped(name, err)
}

// Trim trims the (renamed) stream (store.Compactor); a conversation's
// trims are fenced by its claim like its appends.
func (s *Store) Trim(name string, below uint64) error {
	name = s.rename(name)
	return s.scoped(name, s.Store.Trim(name, below))
}

// First returns the first stored seq of the (renamed) stream.
func (s *Store) First(name string) (uint64, error) {
	name = s.rename(name)
	first, err := s.Store.First(name)
	return first, s.scoped(name, err)
}

// PutBytes writes byte values (store.Compactor); a conversation's are
// fenced by its claim.
func (s *Store) PutBytes(values []store.Bytes) error {
	err := s.Store.PutBytes(values)
	if err != nil && len(values) > 0 {
		err = s.scoped(values[0].Key, err)
	}
	return err
}

// GetBytes reads a byte value.
func (s *Store) GetBytes(key string) ([]byte, error) {
	v, err := s.Store.GetBytes(key)
	return v, s.scoped(key, err)
}

// Flush makes every write durable. A failed conversation scope is reported
// as its *ConversationError, unless the node's global scope failed too.
func (s *Store) Flush() error {
	err := s.Store.Flush()
	var ce *ConversationError
	if err != nil && s.Store.Failed("") == nil && !errors.As(err, &ce) && errors.Is(err, store.ErrFailed) {
		err = &ConversationError{err: err}
	}
	return err
}

// Len returns the length of the (renamed) stream.
func (s *Store) Len(name string) (uint64, error) {
	name = s.rename(name)
	n, err := s.Store.Len(name)
	return n, s.scoped(name, err)
}

// CAS writes the (renamed) value; the incarnation is written as this
// node's own count, and refused if old or new names another node.
func (s *Store) CAS(key string, old, new uint64) error {
	if key == participant.IncarnationKey {
		if (old != 0 && old>>ordinalShift != s.ordinal) || new>>ordinalShift != s.ordinal {
			return fmt.Errorf("cluster: incarnation %d -> %d is not node ordinal %d's: %w", old, new, s.ordinal, store.ErrCASConflict)
		}
		return s.Store.CAS(s.incarnation, old&localMask, new&localMask)
	}
	key = s.rename(key)
	return s.scoped(key, s.Store.CAS(key, old, new))
}

// ReadValue reads the (renamed) value; see Store for the incarnation.
func (s *Store) ReadValue(key string) (uint64, error) {
	if key == participant.IncarnationKey {
		v, err := s.Store.ReadValue(s.incarnation)
		if err != nil {
			return 0, err
		}
		return s.ordinal<<ordinalShift | v, nil
	}
	key = s.rename(key)
	v, err := s.Store.ReadValue(key)
	return v, s.scoped(key, err)
}

// KeepsOrderWithin implements store.ScopeOrdered for the (renamed)
// names: the writes of one conversation's scope keep their order.
func (s *Store) KeepsOrderWithin(names ...string) bool {
	renamed := make([]string, len(names))
	for i, n := range names {
		renamed[i] = s.rename(n)
	}
	return s.Store.KeepsOrderWithin(renamed...)
}
