package server

import (
	"net/http"
	"time"
)

// Audit of admin reads. Every admin request that carries the admin token
// leaves one log line at info: the admin writes (backup, evict, drop) say
// what they did (admin.go, admin_evict.go); the reads (a conversation's
// status, pprof pages and profiles, whose goroutine dumps show every
// stack, the ids of unloadable conversations) say who asked for what and
// how it ended, through auditRead. Refused requests are logged by
// requireAdmin, at most one line a second, and all counted. Nothing of the
// token is logged.

// auditWriter records the status and the bytes of an answer.
type auditWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (a *auditWriter) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *auditWriter) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	n, err := a.ResponseWriter.Write(p)
	a.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer
// (pprof's profiles set their own write deadline through it).
func (a *auditWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// Flush passes a flush on, for the handlers that stream.
func (a *auditWriter) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// auditRead serves the admin read h to r and logs it: the peer (the
// admin token names no one: its address is the principal), the method,
// the path and query (a profile's seconds), the status, the bytes and the
// time it took.
func (s *Server) auditRead(w http.ResponseWriter, r *http.Request, h http.Handler) {
	start := time.Now()
	aw := &auditWriter{ResponseWriter: w}
	defer func() {
		status := aw.status
		if status == 0 {
			status = http.StatusOK
		}
		s.log.Info().Str("remote", r.RemoteAddr).Str("principal", s.auth.principal(remoteAddr(r)).String()).
			Str("method", r.Method).Str("path", clip(r.URL.Path)).Str("query", clip(r.URL.RawQuery)).
			Int("status", status).Int64("bytes", aw.bytes).Dur("duration_ms", time.Since(start)).
			Msg("admin: read served")
	}()
	h.ServeHTTP(aw, r)
}
