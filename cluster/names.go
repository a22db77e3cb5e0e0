package cluster

import (
	"fmt"
	"strings"

	"github.com/participantd/participantd/oplog"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/etcdstore"
)

// tokenPrefix starts the participant's token index keys
// (token/<conversation>/…).
const tokenPrefix = "token/"

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
	case strings.HasPrefix(name, participant.CheckpointPrefix):
		rest = name[len(participant.CheckpointPrefix):]
	case strings.HasPrefix(name, tokenPrefix), strings.HasPrefix(name, participant.ReceiptPrefix):
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
	case participant.RegistryStream:
		return s.registry
	}
	return name
}

const localMask = 1<<ordinalShift - 1

// Append appends to the (renamed) stream.
func (s *Store) Append(name string, payload []byte, expectedSeq uint64) (uint64, error) {
	return s.Store.Append(s.rename(name), payload, expectedSeq)
}

// ReadFrom reads the (renamed) stream.
func (s *Store) ReadFrom(name string, offset uint64, limit int) ([]store.Entry, error) {
	return s.Store.ReadFrom(s.rename(name), offset, limit)
}

// ReadPage reads a page of the (renamed) stream (store.PageReader).
func (s *Store) ReadPage(name string, offset uint64, limit int, maxBytes int) ([]store.Entry, error) {
	return s.Store.ReadPage(s.rename(name), offset, limit, maxBytes)
}

// Trim trims the (renamed) stream (store.Compactor); a conversation's
// trims are fenced by its claim like its appends.
func (s *Store) Trim(name string, below uint64) error { return s.Store.Trim(s.rename(name), below) }

// First returns the first stored seq of the (renamed) stream.
func (s *Store) First(name string) (uint64, error) { return s.Store.First(s.rename(name)) }

// Len returns the length of the (renamed) stream.
func (s *Store) Len(name string) (uint64, error) { return s.Store.Len(s.rename(name)) }

// CAS writes the (renamed) value; the incarnation is written as this
// node's own count, and refused if old or new names another node.
func (s *Store) CAS(key string, old, new uint64) error {
	if key == participant.IncarnationKey {
		if (old != 0 && old>>ordinalShift != s.ordinal) || new>>ordinalShift != s.ordinal {
			return fmt.Errorf("cluster: incarnation %d -> %d is not node ordinal %d's: %w", old, new, s.ordinal, store.ErrCASConflict)
		}
		return s.Store.CAS(s.incarnation, old&localMask, new&localMask)
	}
	return s.Store.CAS(s.rename(key), old, new)
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
	return s.Store.ReadValue(s.rename(key))
}
