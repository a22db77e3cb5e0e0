package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
)

// Eviction endpoints, on the health listener beside /admin/backup and
// guarded the same way (the admin token):
//
//	POST /admin/evict?conversation=C&participant=P
//	     200 {"conversation":C,"participant":P,"seq":S}: P left, cause
//	     evicted, committed through both barriers
//	POST /admin/drop?conversation=C
//	     200 {"conversation":C,"evicted":[{"participant":P,"seq":S},...]}:
//	     every participant that had not left did, cause evicted
//
// A refusal is a JSON {"code","detail","owner"?} with the protocol's code:
// 400 a bad query; 404 unknown_participant; 409 retired; 421 moved, with
// the owner's address in a cluster (ask that node's health listener); 503
// shutting_down, unavailable or in_doubt (an in_doubt eviction may have
// committed: evicting again answers retired if it did). Every request that
// reaches the service is logged at info or warn level with the remote
// address, what was asked and the outcome: the audit trail of evictions.

// evictTimeout bounds how long an eviction waits for its conversation.
const evictTimeout = 30 * time.Second

// evictedJSON is one committed eviction.
type evictedJSON struct {
	Conversation uint64 `json:"conversation,omitempty"`
	Participant  uint64 `json:"participant"`
	Seq          uint64 `json:"seq"`
}

func (s *Server) registerEvict(mux *http.ServeMux) {
	mux.Handle("POST /admin/evict", s.adminOnly(http.HandlerFunc(s.serveEvict)))
	mux.Handle("POST /admin/drop", s.adminOnly(http.HandlerFunc(s.serveDrop)))
}

// serveEvict evicts ?participant= of ?conversation=.
func (s *Server) serveEvict(w http.ResponseWriter, r *http.Request) {
	c, ok := queryUint(w, r, "conversation")
	if !ok {
		return
	}
	p, ok := queryUint(w, r, "participant")
	if !ok {
		return
	}
	svc, ok := s.openService(w)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), evictTimeout)
	defer cancel()
	ended, err := svc.Evict(ctx, participant.ConversationID(c), participant.ParticipantID(p))
	log := s.auditLog(r, "evict").With().Uint64("conversation", c).Uint64("participant", p).Logger()
	if err != nil {
		log.Warn().Err(err).Msg("admin: eviction refused")
		writeAdminError(w, err)
		return
	}
	log.Info().Uint64("seq", uint64(ended.Seq)).Msg("admin: participant evicted")
	writeJSON(w, evictedJSON{Conversation: c, Participant: p, Seq: uint64(ended.Seq)})
}

// serveDrop evicts every participant of ?conversation=.
func (s *Server) serveDrop(w http.ResponseWriter, r *http.Request) {
	c, ok := queryUint(w, r, "conversation")
	if !ok {
		return
	}
	svc, ok := s.openService(w)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), evictTimeout)
	defer cancel()
	ended, err := svc.Drop(ctx, participant.ConversationID(c))
	log := s.auditLog(r, "drop").With().Uint64("conversation", c).Logger()
	if err != nil {
		log.Warn().Err(err).Msg("admin: drop refused")
		writeAdminError(w, err)
		return
	}
	out := struct {
		Conversation uint64        `json:"conversation"`
		Evicted      []evictedJSON `json:"evicted"`
	}{Conversation: c, Evicted: []evictedJSON{}}
	for _, e := range ended {
		out.Evicted = append(out.Evicted, evictedJSON{Participant: uint64(e.Participant), Seq: uint64(e.Seq)})
	}
	log.Info().Int("evicted", len(ended)).Msg("admin: conversation dropped")
	writeJSON(w, out)
}

// auditLog is the audit logger of one admin request: who asked, and what.
func (s *Server) auditLog(r *http.Request, action string) zerolog.Logger {
	return s.log.With().Str("remote", r.RemoteAddr).Str("action", action).Logger()
}

// openService returns the service, or answers 503 while it is not open.
func (s *Server) openService(w http.ResponseWriter) (*participant.Service, bool) {
	svc := s.svc.Load()
	if svc == nil {
		http.Error(w, "service not open yet", http.StatusServiceUnavailable)
	}
	return svc, svc != nil
}

// queryUint reads the unsigned integer query parameter name, answering 400
// when it is missing or malformed.
func queryUint(w http.ResponseWriter, r *http.Request, name string) (uint64, bool) {
	v, err := strconv.ParseUint(r.URL.Query().Get(name), 10, 64)
	if err != nil {
		http.Error(w, "query parameter "+name+": want an unsigned integer", http.StatusBadRequest)
		return 0, false
	}
	return v, true
}

// adminErrorJSON is the body of a refused eviction.
type adminErrorJSON struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
	Owner  string `json:"owner,omitempty"`
}

// writeAdminError answers err, a *participant.Error or not, with its
// status and code.
func writeAdminError(w http.ResponseWriter, err error) {
	body := adminErrorJSON{Code: string(participant.CodeUnavailable), Detail: err.Error()}
	status := http.StatusServiceUnavailable
	var pe *participant.Error
	if errors.As(err, &pe) {
		body.Code, body.Detail, body.Owner = string(pe.Code), pe.Detail, pe.Owner
		switch pe.Code {
		case participant.CodeUnknownParticipant:
			status = http.StatusNotFound
		case participant.CodeRetired:
			status = http.StatusConflict
		case participant.CodeMoved:
			status = http.StatusMisdirectedRequest
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
