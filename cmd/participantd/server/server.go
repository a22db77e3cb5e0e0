package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/store/logfirst"
	"github.com/participantd/participantd/wire"
)

// ErrDrainTimeout is returned by Run when the drain did not finish within
// DrainTimeout and the remaining connections were cut.
var ErrDrainTimeout = errors.New("server: drain timed out")

// Server is one participantd: a wire listener and a health listener over one
// participant service. Create it with New, then call Run once.
type Server struct {
	cfg     Config
	log     zerolog.Logger
	ln      net.Listener
	hln     net.Listener
	metrics *metrics

	// readyCh is closed once the service is open and accepting.
	readyCh chan struct{}
	// ready is what /ready reports: serving and not draining.
	ready atomic.Bool
	// svc and st are set once Run opened them.
	svc atomic.Pointer[participant.Service]
	st  atomic.Pointer[logfirst.Store]

	// opCtx is the context of every operation and binding ending; it is
	// cancelled only when the drain times out.
	opCtx    context.Context
	opCancel context.CancelFunc

	// connWG counts the goroutines serving connections.
	connWG sync.WaitGroup

	// mu guards the fields below.
	mu sync.Mutex
	// conns are the connections being served.
	conns    map[*conn]struct{}
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
	var tlsConf *tls.Config
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("server: tls-cert/tls-key: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
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
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger.With().Str("component", "server").Logger(),
		ln:      ln,
		hln:     hln,
		readyCh: make(chan struct{}),
		conns:   make(map[*conn]struct{}),
	}
	s.opCtx, s.opCancel = context.WithCancel(context.Background())
	s.metrics = newMetrics(s)
	return s, nil
}

// Addr returns the wire listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// HealthAddr returns the health listener's address.
func (s *Server) HealthAddr() net.Addr { return s.hln.Addr() }

// Ready returns a channel closed once Run has reconciled the store and
// accepts connections.
func (s *Server) Ready() <-chan struct{} { return s.readyCh }

// Service returns the participant service, nil before Run opened it.
func (s *Server) Service() *participant.Service { return s.svc.Load() }

// Run serves until ctx is cancelled, then drains and returns nil, or
// ErrDrainTimeout when the drain was cut short. It returns an error at once
// when the data directory, node key, store or service cannot be opened; the
// listeners are closed either way. Run must be called once.
func (s *Server) Run(ctx context.Context) error {
	defer s.opCancel()
	hsrv := &http.Server{Handler: s.healthHandler(), ReadHeaderTimeout: 10 * time.Second}
	hdone := make(chan struct{})
	go func() {
		defer close(hdone)
		if err := hsrv.Serve(s.hln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error().Err(err).Msg("health listener failed")
		}
	}()
	defer func() {
		hsrv.Close()
		<-hdone
	}()

	st, svc, err := s.open(ctx)
	if err != nil {
		s.ln.Close()
		return err
	}
	s.st.Store(st)
	s.svc.Store(svc)
	s.ready.Store(true)
	close(s.readyCh)
	s.log.Info().Str("listen", s.ln.Addr().String()).Str("health", s.hln.Addr().String()).
		Uint64("incarnation", svc.Incarnation()).Msg("serving")

	acceptDone := make(chan error, 1)
	go func() { acceptDone <- s.acceptLoop() }()
	var acceptErr error
	select {
	case <-ctx.Done():
	case acceptErr = <-acceptDone:
		s.log.Error().Err(acceptErr).Msg("wire listener failed; draining")
	}
	err = s.drain(acceptDone, acceptErr != nil)
	svc.Close()
	if cerr := st.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("server: close store: %w", cerr)
	}
	if err == nil && acceptErr != nil {
		err = fmt.Errorf("server: accept: %w", acceptErr)
	}
	s.log.Info().Err(err).Msg("stopped")
	return err
}

// open creates the data directory and opens the node key, the store and
// the service, which reconciles every conversation before returning.
func (s *Server) open(ctx context.Context) (*logfirst.Store, *participant.Service, error) {
	if err := os.MkdirAll(s.cfg.DataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("server: data directory: %w", err)
	}
	key, err := participant.LoadOrCreateNodeKey(s.cfg.DataDir)
	if err != nil {
		return nil, nil, fmt.Errorf("server: node key: %w", err)
	}
	// The log-first store: participantd.db (StoreFile) and wal/ in the data
	// directory; it replays the log after the last checkpoint first.
	st, err := logfirst.Open(s.cfg.DataDir, logfirst.Options{Logger: s.cfg.Logger})
	if err != nil {
		return nil, nil, fmt.Errorf("server: store: %w", err)
	}
	rp := st.Replay()
	s.log.Info().Int("records", rp.Log.Records).Uint64("checkpoint_lsn", uint64(rp.CheckpointLSN)).
		Bool("torn_tail_cut", rp.Log.Torn).Dur("took", rp.Duration).Msg("log replayed")
	s.st.Store(st)
	svc, err := participant.Open(ctx, st, participant.Options{
		NodeKey:                 key,
		ReceiptTTL:              s.cfg.ReceiptTTL,
		MaxRecordBytes:          s.cfg.MaxRecordBytes,
		MaxParticipants:         s.cfg.MaxParticipants,
		MaxConversationsPerConn: s.cfg.MaxConversationsPerConn,
		Logger:                  s.cfg.Logger,
		Observer:                s.metrics,
	})
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("server: open service: %w", err)
	}
	return st, svc, nil
}

// acceptLoop accepts until the listener closes; it returns nil then, or
// the error that stopped it.
func (s *Server) acceptLoop() error {
	var backoff time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn().Err(err).Dur("backoff", backoff).Msg("accept failed; retrying")
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.admit(nc)
	}
}

// isTemporary reports accept errors worth retrying, such as running out of
// file descriptors.
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// admit starts serving nc, or refuses it when the server is full or
// draining.
func (s *Server) admit(nc net.Conn) {
	s.mu.Lock()
	var reason wire.Reason
	switch {
	case s.draining:
		reason = wire.ReasonShuttingDown
	case len(s.conns) >= s.cfg.MaxConnections:
		reason = wire.ReasonOverloaded
	}
	var c *conn
	if reason == "" {
		c = newConn(s, nc)
		s.conns[c] = struct{}{}
	}
	s.connWG.Add(1)
	s.mu.Unlock()
	if c == nil {
		go func() {
			defer s.connWG.Done()
			s.refuse(nc, reason, "the server is "+map[wire.Reason]string{
				wire.ReasonShuttingDown: "shutting down",
				wire.ReasonOverloaded:   fmt.Sprintf("at its limit of %d connections", s.cfg.MaxConnections),
			}[reason])
		}()
		return
	}
	s.metrics.connOpened()
	go func() {
		defer s.connWG.Done()
		defer s.metrics.connClosed()
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
		c.serve()
	}()
}

// refuse sends rejected{reason} on a connection that never got a welcome,
// then closes it.
func (s *Server) refuse(nc net.Conn, reason wire.Reason, detail string) {
	s.metrics.refused(reason)
	s.log.Info().Str("remote", nc.RemoteAddr().String()).Str("reason", string(reason)).
		Str("detail", detail).Msg("connection refused")
	nc.SetWriteDeadline(time.Now().Add(s.cfg.HelloTimeout))
	nc.Write(wire.AppendFrame(nil, &wire.Rejected{Reason: reason, Detail: detail}))
	lingerClose(nc)
}

// drain stops accepting and tears every connection down (see the package
// documentation), waiting at most DrainTimeout.
func (s *Server) drain(acceptDone <-chan error, acceptStopped bool) error {
	start := time.Now()
	s.ready.Store(false)
	s.ln.Close()
	if !acceptStopped {
		<-acceptDone
	}
	if svc := s.svc.Load(); svc != nil {
		svc.Drain()
	}
	s.mu.Lock()
	s.draining = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
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
		s.log.Info().Dur("took", time.Since(start)).Msg("drained")
		return nil
	case <-timer.C:
	}
	s.log.Warn().Dur("drain_timeout", s.cfg.DrainTimeout).Msg("drain timed out; closing the remaining connections")
	s.opCancel()
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	<-done
	return ErrDrainTimeout
}
