package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/cluster/backup"
	"github.com/participantd/participantd/store"
)

// Admin endpoints, on the health listener, enabled only when
// Config.AdminToken is set and guarded by it:
//
//	POST /admin/backup   Authorization: Bearer <admin token>
//	                     200: a consistent copy of the data file
//	                     (application/octet-stream, Content-Length set
//	                     before the first byte, so a cut copy is seen as
//	                     such); 401 wrong or missing token; 404 when no
//	                     admin token is configured; 503 before the store
//	                     is open
//
// The copy is a consistent bbolt file: one bbolt read transaction
// (boltstore.Store.Backup), after the log-first store has checkpointed every
// batch committed before the request (logfirst.Store.Backup). It holds
// every operation answered before the request, and serving goes on while
// it streams. The node key is not in it: it never changes, and is backed
// up once, apart.
//
// In cluster mode, any node answers with a cluster backup of the whole
// data set under the etcd prefix (package cluster/backup: every key read
// at one etcd revision, streamed page by page, with a checksummed trailer;
// the cluster secret is in it). Its size is not known in advance: the
// trailer is what tells a whole copy from a cut one, and a failure after
// the first byte aborts the connection. A revision compacted during the
// read fails the backup (take it again).
func (s *Server) registerAdmin(mux *http.ServeMux) {
	if s.cfg.AdminToken == "" {
		return
	}
	s.registerEvict(mux)
	mux.HandleFunc("POST /admin/backup", func(w http.ResponseWriter, r *http.Request) {
		if !s.requireAdmin(w, r) {
			return
		}
		ref := s.st.Load()
		if ref == nil {
			http.Error(w, "store not open yet", http.StatusServiceUnavailable)
			return
		}
		if cb, ok := ref.backend.(*clusterBackend); ok {
			s.serveClusterBackup(w, r, cb)
			return
		}
		st, ok := ref.backend.(backuper)
		if !ok {
			http.Error(w, "this store has no online backup", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="`+StoreFile+`"`)
		started := false
		n, err := st.Backup(w, func(size int64) {
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			w.WriteHeader(http.StatusOK)
			started = true
		})
		if errors.Is(err, errNoBackup) {
			http.Error(w, "this store engine has no online backup; stop the server and copy the data directory", http.StatusNotImplemented)
			return
		}
		if err != nil {
			s.log.Error().Err(err).Int64("bytes", n).Msg("backup failed")
			if !started {
				http.Error(w, "backup failed", http.StatusInternalServerError)
			}
			// Once the body began, the short Content-Length tells the
			// client the copy is cut.
			return
		}
		s.log.Info().Int64("bytes", n).Str("remote", r.RemoteAddr).Msg("backup served")
	})
	mux.Handle("GET /admin/conversations/{id}", s.adminOnly(http.HandlerFunc(s.serveConversationStatus))) // admin_conversation.go
}

// adminOnly serves h to requests that carry the admin token; a read (GET)
// is audited (admin_audit.go), a write logs what it did itself.
func (s *Server) adminOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.requireAdmin(w, r) {
			return
		}
		if r.Method == http.MethodGet {
			s.auditRead(w, r, h)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// adminLogInterval is the least time between two log lines of refused
// admin requests; the ones in between are counted in the next line.
const adminLogInterval = time.Second

// requireAdmin reports whether r carries the admin token. When it does
// not, it answers 401, counts the refusal and logs it, at most one line
// per adminLogInterval (a peer can send refusals as fast as it likes).
//
// A peer over its allowance of wrong tokens (authGuard) is answered 429
// with Retry-After before its token is compared.
//
// Without Config.AdminRemote only loopback peers are served (403 for the
// others): the health listener may be reachable by probes and Prometheus
// while the admin endpoints stay inside the host or the pod (kubectl
// port-forward arrives from loopback). A proxy on the same host or in the
// pod (a service mesh sidecar) makes every peer loopback: the token is
// then the guard, as it is with AdminRemote.
func (s *Server) requireAdmin(w http.ResponseWriter, r *http.Request) bool {
	peer := remoteAddr(r)
	principal, now := s.auth.principal(peer), time.Now()
	if !s.cfg.AdminRemote && !isLoopback(peer) {
		s.refuseAdmin(w, r, now, http.StatusForbidden, "the admin endpoints answer loopback peers only (admin-remote)",
			"the admin endpoints answer loopback peers only without --admin-remote", nil)
		return false
	}
	if ok, wait := s.auth.admit(principal, "admin", now); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Round(time.Second)/time.Second)+1))
		s.refuseAdmin(w, r, now, http.StatusTooManyRequests, "too many wrong admin tokens from this address",
			"too many wrong admin tokens from this address", func(e *zerolog.Event) { e.Dur("retry_after_ms", wait) })
		return false
	}
	if s.adminAuthorized(r) {
		return true
	}
	s.auth.failed(principal, "admin", now)
	w.Header().Set("WWW-Authenticate", `Bearer realm="participantd admin"`)
	s.refuseAdmin(w, r, now, http.StatusUnauthorized, "admin token required",
		"wrong or missing admin token", func(e *zerolog.Event) { e.Bool("token_presented", r.Header.Get("Authorization") != "") })
	return false
}

// refuseAdmin answers r with status and body, counts the refusal and logs
// it with why and the fields extra adds, at most one line per
// adminLogInterval.
func (s *Server) refuseAdmin(w http.ResponseWriter, r *http.Request, now time.Time, status int, body, why string, extra func(*zerolog.Event)) {
	s.metrics.adminAuthFailed()
	if ok, held := s.adminLog.allow(now, adminLogInterval); ok {
		e := s.log.Warn().Str("remote", r.RemoteAddr).Str("method", r.Method).Str("path", clip(r.URL.Path)).
			Int("refusals_not_logged", held)
		if extra != nil {
			extra(e)
		}
		e.Msg("admin request refused: " + why)
	}
	http.Error(w, body, status)
}

// adminAuthorized reports whether r carries the admin token.
func (s *Server) adminAuthorized(r *http.Request) bool {
	if s.cfg.AdminToken == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return tokenEqual(got, s.cfg.AdminToken) && ok
}

// tokenEqual reports whether got is the secret token want, for hello's
// auth and the admin token alike. Both are hashed first, so the comparison
// takes the same time whatever the length or content of what was
// presented.
func tokenEqual(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// remoteAddr is r's peer address, nil when it does not parse.
func remoteAddr(r *http.Request) net.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return nil
	}
	return net.TCPAddrFromAddrPort(ap)
}

// ClusterBackupContentType is the media type of a cluster backup.
const ClusterBackupContentType = "application/vnd.participantd.cluster-backup"

// serveClusterBackup streams a backup of the cluster's data set at one
// etcd revision.
func (s *Server) serveClusterBackup(w http.ResponseWriter, r *http.Request, cb *clusterBackend) {
	lw := &lazyOK{w: w, contentType: ClusterBackupContentType}
	h, err := backup.Export(r.Context(), cb.cli.KV, s.cfg.Cluster.Prefix, lw, backup.Options{})
	if err != nil {
		s.log.Error().Err(err).Int64("bytes", lw.n).Msg("cluster backup failed")
		if !lw.started {
			code := http.StatusServiceUnavailable
			if errors.Is(err, backup.ErrCompacted) {
				code = http.StatusConflict
			}
			http.Error(w, "cluster backup failed: "+err.Error(), code)
			return
		}
		// The body began: cut the connection, so the client sees an error
		// (the missing trailer tells it too).
		panic(http.ErrAbortHandler)
	}
	s.log.Info().Int64("bytes", lw.n).Int64("revision", h.Revision).Int64("keys", h.Keys).
		Str("remote", r.RemoteAddr).Msg("cluster backup served")
}

// lazyOK writes the 200 status and the headers at the first byte, so that
// an error before it is still answered with an error status.
type lazyOK struct {
	w           http.ResponseWriter
	contentType string
	started     bool
	n           int64
}

func (l *lazyOK) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.Header().Set("Content-Disposition", `attachment; filename="participantd-cluster.backup"`)
		l.w.WriteHeader(http.StatusOK)
	}
	n, err := l.w.Write(p)
	l.n += int64(n)
	return n, err
}

// backuper is a backend that writes a consistent copy of its store file.
type backuper interface {
	Backup(w io.Writer, begin store.BackupSize) (int64, error)
}
