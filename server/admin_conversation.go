package server

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/participantd/participantd/cluster"
	"github.com/participantd/participantd/participant"
)

// GET /admin/conversations/{id}, behind the admin token: which node owns a
// conversation, and, from the node that serves it, its participants, their
// bindings and cursors, and its backlog. No secret is in it (none is
// stored).
//
//	200  ConversationStatus: Here when this node serves the conversation
//	     (a single node always does), else Owner names the node that does,
//	     or nobody (no node owns it now: the next operation on it, at any
//	     node, claims it)
//	400  the id is not a number
//	404  no such conversation
//	503  the service is not open yet, or etcd does not answer the owner
//	     lookup (cluster mode)
//
// A node reads the owner from etcd only when it does not serve the
// conversation itself, and never claims it: asking loads nothing.

// ConversationStatus is the body of GET /admin/conversations/{id}.
type ConversationStatus struct {
	Conversation uint64 `json:"conversation"`
	// Node is the answering node's id; empty on a single node.
	Node string `json:"node,omitempty"`
	// Here reports that the answering node serves the conversation; the
	// fields from Loaded on describe it only then.
	Here bool `json:"here"`
	// Owner is the owning node in cluster mode (the answering one when
	// Here); nil on a single node, and when no node owns it.
	Owner *ConversationOwner `json:"owner,omitempty"`
	// Loaded reports that its reconciled state is in memory; when false,
	// only Unloadable may say more (reloading after a failed commit, or
	// contained).
	Loaded     bool                    `json:"loaded"`
	Unloadable *participant.Unloadable `json:"unloadable,omitempty"`
	// OplogRows is how many oplog rows it has applied; LastSeq the seq of
	// its last record.
	OplogRows uint64 `json:"oplog_rows"`
	LastSeq   uint64 `json:"last_seq"`
	// Backlog is what it retains until every recipient acknowledged it.
	Backlog      ConversationBacklog `json:"backlog"`
	Participants []ParticipantStatus `json:"participants"`
}

// ConversationOwner names a node of the cluster.
type ConversationOwner struct {
	Node string `json:"node"`
	// Addr is its wire address, Health the URL of its health listener
	// (where this endpoint is asked again), empty when not advertised.
	Addr   string `json:"addr"`
	Health string `json:"health,omitempty"`
}

// ConversationBacklog is a conversation's retained records: FirstSeq
// (0 when none) through the last seq, with their payload bytes in memory
// and those dropped from it (read back from the oplog when delivered).
type ConversationBacklog struct {
	Records      int    `json:"records"`
	FirstSeq     uint64 `json:"first_seq"`
	MemoryBytes  int64  `json:"memory_bytes"`
	EvictedBytes int64  `json:"evicted_bytes"`
}

// ParticipantStatus is one member: its generation, binding and cursors.
type ParticipantStatus struct {
	Participant uint64 `json:"participant"`
	Generation  uint64 `json:"generation"`
	Retired     bool   `json:"retired"`
	Bound       bool   `json:"bound"`
	// Connection is the bound connection's id, empty when unbound.
	Connection string `json:"connection,omitempty"`
	// Acked is the durable cursor; Offered the last seq pushed to the
	// binding (at least Acked; 0 when unbound); Unacked the retained
	// records addressed to it above Acked.
	Acked   uint64 `json:"acked"`
	Offered uint64 `json:"offered"`
	Unacked int    `json:"unacked"`
	// Released is the last record addressed to it that was given up
	// unacknowledged (--max-unacked-age) above its cursor; 0 when none.
	Released uint64 `json:"released,omitempty"`
}

// NoSuchConversation is the body of the 404 for a conversation that does
// not exist, which tells it from the 404 of a server whose admin endpoints
// are off.
const NoSuchConversation = "no such conversation"

// ownerLookupTimeout bounds the etcd read of a conversation's owner.
const ownerLookupTimeout = 5 * time.Second

// serveConversationStatus answers GET /admin/conversations/{id}; the
// caller checked the admin token.
func (s *Server) serveConversationStatus(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if err != nil {
		http.Error(w, "the conversation id must be a number", http.StatusBadRequest)
		return
	}
	svc, ok := s.openService(w)
	if !ok {
		return
	}
	conv := participant.ConversationID(id)
	out := ConversationStatus{Conversation: id, Node: s.nodeID()}
	st, known := svc.Status(conv)
	cs := s.clusterOf()
	switch {
	case cs == nil && !known:
		http.Error(w, NoSuchConversation, http.StatusNotFound)
		return
	case cs == nil:
		out.Here = true
	case known && st.Held:
		out.Here = true
		out.Owner = ownerOf(cs.node.Self())
	default:
		ctx, cancel := context.WithTimeout(r.Context(), ownerLookupTimeout)
		defer cancel()
		o, err := cs.node.Owner(ctx, conv)
		if err != nil {
			http.Error(w, "looking the owner up in etcd: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if o.Node == "" {
			exists, err := cs.node.Exists(ctx, conv)
			if err != nil {
				http.Error(w, "looking the conversation up in etcd: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			if !exists {
				http.Error(w, NoSuchConversation, http.StatusNotFound)
				return
			}
		} else {
			out.Owner = ownerOf(o)
		}
		// Its own claim, not held by the local clock (or not loaded):
		// what this node has of it, Loaded saying whether it is current.
		out.Here = o.Self
	}
	if out.Here {
		fillStatus(&out, st)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func ownerOf(o cluster.Owner) *ConversationOwner {
	return &ConversationOwner{Node: o.Node, Addr: o.Addr, Health: o.Health}
}

// fillStatus copies what the service holds of a conversation into out.
func fillStatus(out *ConversationStatus, st participant.Status) {
	out.Loaded, out.Unloadable = st.Loaded, st.Unloadable
	out.OplogRows, out.LastSeq = st.Applied, uint64(st.LastSeq)
	out.Backlog = ConversationBacklog{Records: st.Retained, FirstSeq: uint64(st.FirstRetained),
		MemoryBytes: st.PayloadBytes, EvictedBytes: st.EvictedBytes}
	out.Participants = make([]ParticipantStatus, 0, len(st.Participants))
	for _, p := range st.Participants {
		ps := ParticipantStatus{Participant: uint64(p.Participant), Generation: uint64(p.Generation), Retired: p.Retired,
			Bound: p.Bound, Acked: uint64(p.Acked), Offered: uint64(p.Offered), Unacked: p.Unacked, Released: uint64(p.Released)}
		if p.Bound {
			ps.Connection = p.Conn.String()
		}
		out.Participants = append(out.Participants, ps)
	}
}

// healthURL is the URL of the health listener that a node advertises for
// the conversations it owns: the listener's own address when it is bound
// to one, else the advertised wire host with the listener's port.
func (s *Server) healthURL(advertise string) string {
	scheme := "http://"
	if s.healthTLS != nil {
		scheme = "https://"
	}
	addr, ok := s.hln.Addr().(*net.TCPAddr)
	if !ok {
		return ""
	}
	port := strconv.Itoa(addr.Port)
	if !addr.IP.IsUnspecified() {
		return scheme + net.JoinHostPort(addr.IP.String(), port)
	}
	host, _, err := net.SplitHostPort(advertise)
	if err != nil || host == "" {
		return ""
	}
	return scheme + net.JoinHostPort(host, port)
}
