package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/wire"
)

// Errors of Run.
var (
	// ErrDrainTimeout is returned by Run when the drain did not finish
	// within DrainTimeout and the remaining connections were cut.
	ErrDrainTimeout = errors.New("server: drain timed out")
	// ErrStoreFailed is returned by Run, wrapping the store's error, when
	// the store failed for good (store.ErrFailed: a failed fsync, a full
	// disk) and the server drained because of it: only a restart, which
	// reconciles, can serve again.
	ErrStoreFailed = errors.New("server: the store failed")
	// ErrStoreHung is returned by Run when its shutdown gave up on the
	// store after StoreCloseTimeout: an operation inside the store, the
	// service's background work on it, or closing it did not finish (a
	// dead disk, a hung NFS mount). The process must exit: the abandoned
	// store keeps the data directory locked until it does (see closeStore
	// for why exiting is safe).
	ErrStoreHung = errors.New("server: the store stopped answering; the shutdown gave up on it")
)

// Server is one participantd: a wire listener and a health listener over one
// participant service. Create it with New, then call Run once.
type Server struct {
	cfg Config
	log zerolog.Logger
	// ln is the plain TCP wire listener: a TLS connection is wrapped
	// after accept (wireTLS), so that its handshake runs under the
	// connection's deadline rather than inside Accept or a first Read.
	ln net.Listener
	// wsln is the WebSocket listener, nil unless WSListen is set: its
	// connections are served by the same code (wsConn).
	wsln      net.Listener
	hln       net.Listener
	wireTLS   *certs
	healthTLS *certs
	metrics   *metrics
	// adminLog and refuseLog rate-limit the log lines of refused admin
	// requests and of refused connections, which any peer can cause.
	// (One name per field in this struct: checklocks matches annotations
	// to fields by position, which a line declaring two fields shifts.)
	adminLog  logLimiter
	refuseLog logLimiter
	// auth slows and counts wrong auth and admin tokens per peer
	// (authguard.go).
	auth *authGuard

	// readyCh is closed once the service is open and accepting.
	readyCh chan struct{}
	// ready is what /ready reports: serving and not draining.
	ready atomic.Bool
	// etcdWaiting is set while a cluster node's start waits for etcd
	// (etcdwait.go): what /ready says then.
	etcdWaiting atomic.Pointer[etcdWait]
	// etcdDiagnosis is the last diagnoseEtcd of a running node whose etcd
	// stopped answering, reused by /ready for diagnoseEvery, so that
	// probes polling /ready do not each dial every endpoint.
	etcdDiagnosis atomic.Pointer[etcdWait]
	// svc and st are set once Run opened them; cl in cluster mode only.
	svc atomic.Pointer[participant.Service]
	st  atomic.Pointer[backendRef]
	cl  atomic.Pointer[clusterState]
	// watched is the store as the service sees it, with its calls in
	// flight; hung is set when the shutdown gave up on the store.
	watched atomic.Pointer[watchedStore]
	hung    atomic.Bool

	// opCtx is the context of every operation and binding ending; it is
	// cancelled only when the drain times out.
	opCtx    context.Context
	opCancel context.CancelFunc
	// tracer traces requests (trace.go); nil when tracing is off.
	tracer trace.Tracer

	// outBytes and pendingBytes are the server-wide budgets of queued
	// outbound frames and of pending request frames, shared out per
	// principal (shares.go).
	outBytes     *sharedBudget
	pendingBytes *sharedBudget

	// connWG counts the goroutines serving connections.
	connWG sync.WaitGroup
	// work runs the connections' conversation workers; Run stops it.
	work *workPool

	// mu guards the fields below.
	mu sync.Mutex
	// conns are the connections being served.
	// +checklocks:mu
	conns map[*conn]struct{}
	// refusing are the connections being sent rejected{...}; the drain
	// cuts them short.
	// +checklocks:mu
	refusing map[net.Conn]struct{}
	// peers are the per-address connection counts and rates: the pointer
	// is set once, by New, and what it points to is guarded by mu (the
	// peerLimits methods ending in Locked).
	peers *peerLimits
	// adminTokenGenerated is set by New when cfg.AdminToken was generated
	// (Config.LocalAdminToken); Run publishes it.
	adminTokenGenerated bool
	// +checklocks:mu
	draining bool
}

// New validates cfg and binds the wire and health listeners, so that Addr
// and HealthAddr are known when it returns. Nothing is served until Run.
// Errors name the setting or address at fault.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.Cluster.validate(); err != nil {
		return nil, err
	}
	wireTLS, err := loadTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, "tls")
	if err != nil {
		return nil, err
	}
	healthTLS, err := loadTLS(cfg.HealthTLSCert, cfg.HealthTLSKey, "", "health-tls")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("server: listen: %w", err)
	}
	hln, err := net.Listen("tcp", cfg.HealthListen)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("server: health-listen: %w", err)
	}
	if err := checkHealthExposure(cfg, hln.Addr(), healthTLS != nil); err != nil {
		ln.Close()
		hln.Close()
		return nil, err
	}
	generated := false
	if cfg.LocalAdminToken && cfg.AdminToken == "" && isLoopback(hln.Addr()) {
		if cfg.AdminToken, err = generateAdminToken(); err != nil {
			ln.Close()
			hln.Close()
			return nil, err
		}
		generated = true
	}
	var wsln net.Listener
	if cfg.WSListen != "" {
		if wsln, err = net.Listen("tcp", cfg.WSListen); err != nil {
			ln.Close()
			hln.Close()
			return nil, fmt.Errorf("server: ws-listen: %w", err)
		}
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger.With().Str("component", "server").Logger(),
		ln:        ln,
		wsln:      wsln,
		hln:       hln,
		wireTLS:   wireTLS,
		healthTLS: healthTLS,
		readyCh:   make(chan struct{}),
		conns:     make(map[*conn]struct{}),
		refusing:  make(map[net.Conn]struct{}),
		peers:     newPeerLimits(cfg),

		adminTokenGenerated: generated,

		outBytes:     newSharedBudget(int64(cfg.MaxOutboundTotal), cfg.ClientShare, int64(cfg.MaxOutboundBytes)),
		pendingBytes: newSharedBudget(int64(cfg.MaxPendingBytesTotal), cfg.ClientShare, int64(cfg.MaxFrame)),
	}
	s.opCtx, s.opCancel = context.WithCancel(context.Background())
	s.work = newWorkPool()
	s.tracer = newTracer(cfg.TracerProvider)
	s.metrics = newMetrics(s)
	s.auth = newAuthGuard(s.metrics.reg, s.peers.v4, s.peers.v6)
	return s, nil
}

// Addr returns the wire listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// WSAddr returns the WebSocket listener's address, nil when it is off.
func (s *Server) WSAddr() net.Addr {
	if s.wsln == nil {
		return nil
	}
	return s.wsln.Addr()
}

// HealthAddr returns the health listener's address.
func (s *Server) HealthAddr() net.Addr { return s.hln.Addr() }

// Ready returns a channel closed once Run has reconciled the store and
// accepts connections.
func (s *Server) Ready() <-chan struct{} { return s.readyCh }

// Service returns the participant service, nil before Run opened it.
func (s *Server) Service() *participant.Service { return s.svc.Load() }

// Run serves until ctx is cancelled, then drains and returns nil, or
// ErrDrainTimeout when the drain was cut short. When the store fails for
// good while serving, /ready turns 503 at once and Run drains as for a
// cancel (answering what it can, closing every connection) and returns an
// error wrapping ErrStoreFailed and the store's error. It returns an error at once
// when the data directory, node key, store or service cannot be opened; the
// listeners are closed either way. Run must be called once.
//
// Run returns within DrainTimeout + StoreCloseTimeout of the cancel
// whatever the store does: past that it gives up on a store that stopped
// answering and returns an error wrapping ErrStoreHung, leaving the store
// open and the data directory locked until the process exits.
func (s *Server) Run(ctx context.Context) error {
	defer s.opCancel()
	defer s.work.stop()
	// Requests carry no body: reading one, and a keep-alive, are bounded;
	// writing is not, since a backup streams for as long as it takes.
	hsrv := &http.Server{Handler: s.healthHandler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: log.New(httpErrorLog{s.log}, "", 0)}
	hln := s.hln
	if s.healthTLS != nil {
		hln = tls.NewListener(hln, s.healthTLS.conf)
	}
	hdone := make(chan struct{})
	go func() {
		defer close(hdone)
		if err := hsrv.Serve(hln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error().Err(err).Msg("health listener failed")
		}
	}()
	defer func() {
		hsrv.Close()
		<-hdone
	}()

	st, svc, err := s.open(ctx)
	if err != nil {
		s.closeListeners()
		return err
	}
	s.st.Store(&backendRef{st})
	s.svc.Store(svc)
	// After open: in single-node mode the data directory is locked, so a
	// second server on it cannot replace the running one's token.
	if err := s.publishAdminToken(); err != nil {
		s.log.Warn().Err(err).Msg("participantctl on this host will not find the admin token")
	} else if s.adminTokenGenerated {
		s.log.Info().Str("admin_token_file", filepath.Join(s.cfg.DataDir, AdminTokenFile)).
			Msg("admin endpoints enabled on the loopback health listener with a generated token")
	}
	s.ready.Store(true)
	close(s.readyCh)
	s.log.Info().Str("listen", s.ln.Addr().String()).Str("health", s.hln.Addr().String()).
		Uint64("incarnation", svc.Incarnation()).Str("enroll_policy", string(s.cfg.EnrollPolicy)).Int("max_conversations", s.cfg.MaxConversations).Msg("serving")
	if s.cfg.AdminRemote && (s.cfg.AdminToken != "" || s.cfg.Pprof) && !isLoopback(s.hln.Addr()) {
		s.log.Warn().Str("health", s.hln.Addr().String()).Bool("pprof", s.cfg.Pprof).
			Msg("the admin endpoints are reachable beyond loopback (admin-remote): whoever holds the admin token can take a backup, which holds every conversation (and in cluster mode the cluster secret)")
	}
	if s.wsln != nil {
		s.log.Info().Str("ws_listen", s.wsln.Addr().String()).Strs("ws_allowed_origins", s.cfg.WSAllowedOrigins).Msg("serving WebSocket")
	}
	listeners := s.listeners()
	warnOpenAdmission(s.log, s.cfg, listeners)
	// Every listener has its accept loop; stopped receives each one's
	// end, and drain waits for those still running.
	stopped := make(chan acceptEnd, len(listeners))
	for _, l := range listeners {
		go func() { stopped <- acceptEnd{l.name, s.acceptLoop(l.ln, l.ws)} }()
	}
	running := len(listeners)
	var acceptErr, storeErr error
	select {
	case <-ctx.Done():
	case end := <-stopped:
		// An accept loop ends on its own only when its listener failed or
		// was closed under it; either way it is not waited for again.
		running--
		acceptErr = end.err
		s.log.Error().Err(acceptErr).Msg(end.name + " listener stopped; draining")
	case <-svc.StoreFailed():
		// The service logged the failure itself, once.
		storeErr = svc.Failed()
		s.log.Info().Msg("draining because the store failed; restart to reconcile")
	}
	connsDone, err := s.drain(stopped, running)
	switch cerr := s.closeStore(connsDone, svc, st); {
	case errors.Is(cerr, ErrStoreHung):
		err = errors.Join(cerr, err)
	case cerr != nil && err == nil:
		err = cerr
	}
	if err == nil && acceptErr != nil {
		err = fmt.Errorf("server: accept: %w", acceptErr)
	}
	if storeErr != nil {
		err = errors.Join(fmt.Errorf("%w: %w", ErrStoreFailed, storeErr), err)
	}
	s.log.Info().Err(err).Msg("stopped")
	return err
}

// open opens the store and the service, which reconciles every
// conversation before returning: in single-node mode the data directory
// (openDataDir: lock, store, node key), in cluster mode the etcd cluster
// (openCluster).
func (s *Server) open(ctx context.Context) (backend, *participant.Service, error) {
	if s.cfg.Cluster.enabled() {
		return s.openCluster(ctx)
	}
	dd, err := openDataDir(s.cfg.DataDir, s.cfg, s.cfg.Logger)
	if err != nil {
		return nil, nil, err
	}
	s.st.Store(&backendRef{dd})
	var dst store.DurableStore = dd.st
	if s.cfg.WrapStore != nil {
		dst = s.cfg.WrapStore(dd.st)
	}
	w := watch(dst)
	s.watched.Store(w)
	opts := s.serviceOptions(dd.key)
	opts.DataBytes = inUse(dd.st)
	opts.RestoredFrom = restoredFrom(s.cfg.DataDir)
	svc, err := participant.Open(ctx, w, opts)
	if err != nil {
		dd.Close()
		return nil, nil, fmt.Errorf("server: open service: %w", err)
	}
	return dd, svc, nil
}

// serviceOptions are the participant.Options of the configuration, for
// either mode.
func (s *Server) serviceOptions(key []byte) participant.Options {
	return participant.Options{
		NodeKey:                 key,
		ReceiptTTL:              s.cfg.ReceiptTTL,
		MaxRecordBytes:          s.cfg.MaxRecordBytes,
		MaxParticipants:         s.cfg.MaxParticipants,
		MaxConversationsPerConn: s.cfg.MaxConversationsPerConn,
		MaxBacklogBytes:         int64(s.cfg.MaxBacklogBytes),
		MaxBacklogRecords:       s.cfg.MaxBacklogRecords,
		BacklogRecords:          s.cfg.BacklogRecords,
		ClientShare:             s.cfg.ClientShare,
		EnrollPolicy:            s.cfg.EnrollPolicy,
		MaxConversations:        s.cfg.MaxConversations,
		MaxDataBytes:            s.cfg.MaxDataBytes,
		CheckpointInterval:      s.cfg.CheckpointInterval,
		CheckpointRows:          s.cfg.CheckpointRows,
		Retain:                  s.cfg.Retain,
		MaxUnackedAge:           s.cfg.MaxUnackedAge,
		TokenWindow:             s.cfg.TokenWindow,
		TokenSkew:               s.cfg.TokenSkew,
		NoPipeline:              s.cfg.NoPipeline,
		Logger:                  s.cfg.Logger,
		TracerProvider:          s.cfg.TracerProvider,
		Observer:                s.metrics,
		Now:                     s.cfg.Now,
	}
}

// listener is one wire listener and what it serves: the wire protocol
// over TCP, or over WebSocket (ws).
type listener struct {
	name string // for the log: "wire" or "WebSocket"
	ln   net.Listener
	ws   bool
}

// acceptEnd is how a listener's accept loop ended.
type acceptEnd struct {
	name string
	err  error
}

// listeners returns the wire listener and, when WSListen is set, the
// WebSocket one.
func (s *Server) listeners() []listener {
	out := []listener{{"wire", s.ln, false}}
	if s.wsln != nil {
		out = append(out, listener{"WebSocket", s.wsln, true})
	}
	return out
}

// closeListeners closes the wire listeners, which ends their accept loops.
func (s *Server) closeListeners() {
	for _, l := range s.listeners() {
		l.ln.Close()
	}
}

// acceptLoop accepts until the listener closes; it returns nil then, or
// the error that stopped it.
func (s *Server) acceptLoop(ln net.Listener, ws bool) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn().Err(err).Dur("backoff_ms", backoff).Msg("accept failed; retrying")
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.admit(nc, ws)
	}
}

// isTemporary reports accept errors worth retrying, such as running out of
// file descriptors.
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// maxRefusing bounds the refusals being written at once: each one over TLS
// runs a handshake and holds a goroutine until it ends or its deadline
// passes. Past it, a refused connection is closed without a word.
const maxRefusing = 256

// admit starts serving nc, or refuses it when the server is full or
// draining, or when its address holds or opened too many connections.
//
// Every connection gets its deadline here, before any byte is read or
// written: the TLS handshake and hello must both finish within
// HelloTimeout of the accept, and a refusal within refuseTimeout.
//
// A WebSocket connection (ws) is served by the same code through wsConn,
// whose upgrade runs inside the first read of hello, under its deadline.
func (s *Server) admit(raw net.Conn, ws bool) {
	now := time.Now()
	key, limited := s.peers.key(raw.RemoteAddr())
	s.mu.Lock()
	var reason wire.Reason
	var detail string
	switch {
	case s.draining:
		reason, detail = wire.ReasonShuttingDown, "the server is shutting down"
	case len(s.conns) >= s.cfg.MaxConnections:
		reason, detail = wire.ReasonOverloaded, fmt.Sprintf("the server is at its limit of %d connections", s.cfg.MaxConnections)
	case limited:
		detail = s.peers.admitLocked(key, len(s.conns), now)
		if detail != "" {
			reason = wire.ReasonOverloaded
		}
	}
	nc := raw
	if s.wireTLS != nil {
		nc = tls.Server(raw, s.wireTLS.conf)
	}
	if ws {
		nc = newWSConn(nc, s.cfg.WSAllowedOrigins)
	}
	var c *conn
	switch {
	case reason == "":
		raw.SetDeadline(now.Add(s.cfg.HelloTimeout))
		c = newConn(s, nc, key, limited, s.peers.creationsLocked(key, limited, now))
		if limited {
			s.peers.provingLocked(key, &c.count)
		}
		s.conns[c] = struct{}{}
	case len(s.refusing) < maxRefusing:
		raw.SetDeadline(now.Add(s.refuseTimeout()))
		s.refusing[nc] = struct{}{}
	default:
		s.mu.Unlock()
		s.metrics.refused(reason)
		raw.Close()
		return
	}
	s.connWG.Add(1)
	s.mu.Unlock()
	if c == nil {
		go func() {
			defer s.connWG.Done()
			s.refuse(nc, reason, detail)
			s.mu.Lock()
			delete(s.refusing, nc)
			s.mu.Unlock()
		}()
		return
	}
	s.metrics.connOpened(ws)
	go func() {
		defer s.connWG.Done()
		defer s.metrics.connClosed(ws)
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.peers.releaseLocked(c.peer, c.limited, &c.count)
			s.mu.Unlock()
		}()
		c.serve()
	}()
}

// refuseTimeout bounds a refusal: over TLS it runs a whole handshake
// before rejected{...} can be written. It stays within half the drain, so
// that the refusals of a drain end inside it.
func (s *Server) refuseTimeout() time.Duration {
	return min(s.cfg.HelloTimeout, s.cfg.DrainTimeout/2)
}

// refuseLogInterval is the least time between two log lines of refused
// connections (participantd_connections_refused_total counts them all).
const refuseLogInterval = 100 * time.Millisecond

// refuse sends rejected{reason} on a connection that never got a welcome,
// then closes it, within the deadline its caller set.
func (s *Server) refuse(nc net.Conn, reason wire.Reason, detail string) {
	s.metrics.refused(reason)
	if ok, held := s.refuseLog.allow(time.Now(), refuseLogInterval); ok {
		s.log.Info().Str("remote", nc.RemoteAddr().String()).Str("reason", string(reason)).
			Str("detail", detail).Int("refusals_not_logged", held).Msg("connection refused")
	}
	nc.Write(wire.AppendFrame(nil, &wire.Rejected{Reason: reason, Detail: detail}))
	lingerClose(nc)
}

// leaseLost ends every connection that holds a binding with
// bye{lease_lost}; it never blocks (the node's keep-alive calls it). The
// connections are asked outside s.mu: asking reads each one's bindings
// and sets its deadline, which admit need not wait behind.
func (s *Server) leaseLost() {
	s.mu.Lock()
	conns := slices.Collect(maps.Keys(s.conns))
	s.mu.Unlock()
	for _, c := range conns {
		c.requestLeaseLost()
	}
}

// drain stops accepting, waiting for the running accept loops to report
// their end on stopped, and tears every connection down (see the package
// documentation), waiting at most DrainTimeout. It returns a channel closed
// once every connection's goroutines are gone: already closed after a
// clean drain; after ErrDrainTimeout, when those whose sockets it closed
// get out of the operations they were in (closeStore bounds that wait).
func (s *Server) drain(stopped <-chan acceptEnd, running int) (<-chan struct{}, error) {
	start := time.Now()
	s.ready.Store(false)
	s.closeListeners()
	for range running {
		<-stopped
	}
	if svc := s.svc.Load(); svc != nil {
		svc.Drain()
	}
	s.mu.Lock()
	s.draining = true
	conns := slices.Collect(maps.Keys(s.conns))
	// A refusal still in its TLS handshake has nothing worth waiting for.
	for nc := range s.refusing {
		nc.SetDeadline(time.Now())
	}
	s.mu.Unlock()
	s.log.Info().Int("connections", len(conns)).Msg("draining")
	for _, c := range conns {
		c.requestShutdown()
	}
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	timer := time.NewTimer(s.cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
		s.log.Info().Dur("duration_ms", time.Since(start)).Msg("drained")
		return done, nil
	case <-timer.C:
	}
	s.log.Warn().Dur("drain_timeout_ms", s.cfg.DrainTimeout).Msg("drain timed out; closing the remaining connections")
	s.opCancel()
	// The sockets are closed first, so that a client whose operation is
	// stuck in the store (a flush that never returns) learns at once that
	// it has no answer, rather than when the store gives up. closeStore
	// then closes the service, which cancels the context a batch's leader
	// waits on (for a lease, a reload), so that a stuck leader does not
	// hold the connections that wait on it.
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	return done, ErrDrainTimeout
}

// closeStore closes the service and then the store once the connections
// are gone (connsDone), waiting at most StoreCloseTimeout for all of it. It
// returns the store's Close error wrapped, or, when the time ran out, an
// error wrapping ErrStoreHung: it then logs at error level what it was
// waiting for, makes the failure visible (/ready 503,
// participantd_store_failed 1) and abandons the goroutines still waiting,
// which end only if the store answers before the process exits.
//
// Abandoning an open store is safe because it is no worse than a crash,
// which every store survives by contract (store.DurableStore: a crash
// loses exactly the writes no successful Flush covered). Every answer that
// reports a commit was sent after the Flush covering the operation's rows
// returned nil, so nothing the server answered depends on a write the
// abandoned store still holds: the operations stuck in it were answered
// in_doubt or unavailable, or their connections were closed without an
// answer, and the next start's reconciliation settles them as after a
// crash. The flocks on the data directory (LOCK, the store file) are
// released by the OS when the process exits; until then they keep another
// store from opening the directory under one that might still write.
func (s *Server) closeStore(connsDone <-chan struct{}, svc *participant.Service, st backend) error {
	start := time.Now()
	svcDone := make(chan struct{})
	closed := make(chan error, 1)
	var closing atomic.Int64 // unix nanoseconds when st.Close began, 0 before
	// Both goroutines are owned by closeStore, which waits for them unless
	// it gives up on them.
	go func() {
		defer close(svcDone)
		svc.Close()
	}()
	go func() {
		<-connsDone
		<-svcDone
		closing.Store(time.Now().UnixNano())
		closed <- st.Close()
	}()
	timer := time.NewTimer(s.cfg.StoreCloseTimeout)
	defer timer.Stop()
	select {
	case err := <-closed:
		if err != nil {
			return fmt.Errorf("server: close store: %w", err)
		}
		return nil
	case <-timer.C:
	}

	var waiting []string
	select {
	case <-connsDone:
	default:
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		waiting = append(waiting, fmt.Sprintf("%d connections to get out of their store operations", n))
	}
	select {
	case <-svcDone:
	default:
		waiting = append(waiting, "the service's background work (checkpoints, compaction, reloads)")
	}
	ev := s.log.Error()
	what := "the store"
	if call, n, ok := s.oldestStoreCall(); ok {
		what = fmt.Sprintf("store %s, in flight for %v", call, time.Since(call.start).Round(time.Millisecond))
		ev = ev.Str("store_call", call.method).Str("store_call_name", call.name).
			Dur("store_call_ms", time.Since(call.start)).Int("store_calls_in_flight", n)
	}
	if t := closing.Load(); t != 0 {
		waiting = append(waiting, "the store to close")
		what = fmt.Sprintf("store Close, in flight for %v", time.Since(time.Unix(0, t)).Round(time.Millisecond))
		ev = ev.Str("store_call", "Close").Dur("store_call_ms", time.Since(time.Unix(0, t)))
	}
	s.hung.Store(true)
	ev.Strs("waiting_for", waiting).Dur("waited_ms", time.Since(start)).Dur("store_close_timeout_ms", s.cfg.StoreCloseTimeout).
		Msg("the store stopped answering; giving up on it and exiting without closing it: nothing answered depends on it, and the next start reconciles as after a crash")
	return fmt.Errorf("%w: waited %v for %s", ErrStoreHung, s.cfg.StoreCloseTimeout, what)
}

// oldestStoreCall returns the service's store call in flight the longest,
// and how many are in flight.
func (s *Server) oldestStoreCall() (storeCall, int, bool) {
	if w := s.watched.Load(); w != nil {
		return w.oldest()
	}
	return storeCall{}, 0, false
}

// openAdmission reports whether anyone beyond this host may enroll: the
// wire listener's address addr is not a loopback one (an unspecified
// address, 0.0.0.0 or ::, listens on every interface), no auth token is
// required, and the enroll policy is open.
func openAdmission(cfg Config, addr net.Addr) bool {
	return !isLoopback(addr) && cfg.AuthToken == "" && cfg.EnrollPolicy == participant.EnrollOpen
}

// warnOpenAdmission warns once for each wire listener, TCP or WebSocket,
// through which anyone beyond this host may enroll (openAdmission).
func warnOpenAdmission(log zerolog.Logger, cfg Config, listeners []listener) {
	for _, l := range listeners {
		if openAdmission(cfg, l.ln.Addr()) {
			log.Warn().Str("listener", l.name).Str("listen", l.ln.Addr().String()).
				Msg("listening beyond loopback with no auth token and the open enroll policy: anyone who can connect can enroll into any conversation and read it; set --auth-token or --enroll-policy invite")
		}
	}
}

// httpErrorLog sends net/http's own error lines (a failed TLS handshake,
// a peer gone mid-request) to the server's log at debug level, since any
// peer can cause them at will.
type httpErrorLog struct{ log zerolog.Logger }

func (l httpErrorLog) Write(p []byte) (int, error) {
	l.log.Debug().Str("error", clip(strings.TrimSpace(string(p)))).Msg("health listener")
	return len(p), nil
}

// inUse returns a probe of the bytes st holds (its file's free pages not
// counted), 0 while it cannot tell: a failed store refuses writes anyway.
func inUse(st dataStore) func() int64 {
	return func() int64 {
		n, err := st.InUse()
		if err != nil {
			return 0
		}
		return n
	}
}
