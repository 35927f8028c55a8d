// Package server is heft-coordinator's network face: the agents' websocket
// hub, the /api/v1 JSON API, the live event stream, Prometheus metrics and
// the dashboard. All fleet logic lives in package fleet; this package
// authenticates, bounds and routes.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/coordinator/audit"
	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/shared/settings"
	"heft/shared/view"
	"heft/shared/wire"
)

// fleetAPI is what the server needs of *fleet.Fleet; tests fake it.
type fleetAPI interface {
	Connect(node string, conn uint64, hello wire.Hello) []fleet.Action
	Disconnect(node string, conn uint64)
	Snapshot(node string, s wire.Snapshot) []fleet.Action
	ProbeResult(node string, r wire.ProbeResult) ([]fleet.Action, error)
	ProbeStatus(node string, s wire.ProbeStatus) []fleet.Action
	Tick() []fleet.Action
	Pin(id string, weight float64) error
	Unpin(id string) error
	PinKind(id, kind string, weight float64) error
	UnpinKind(id, kind string) error
	Admit(id string) error
	Hold(id string) error
	HoldBelowFloor(id string) error
	Probe(id string) ([]fleet.Action, error)
	Workers() []view.Worker
	Find(q fleet.Query) ([]view.Worker, bool)
	Worker(id string) (view.Worker, bool)
	Weights(model string) (view.Weights, bool)
	WeightsOf(model, kind string) (view.Weights, bool, error)
	Models() []string
	Changes() (<-chan struct{}, func())
	Since(seq uint64) fleet.Delta
	Stats() fleet.Stats
	SetAddressRefusals(node string, refused map[string]string)
	ForgetNode(node string) error
	Held(node string) fleet.Held
}

// Options are what the server needs of the coordinator's configuration;
// package coordinator maps config.Config onto them.
type Options struct {
	// Tokens are the tokens at start; Reload replaces them.
	Tokens Tokens
	// TLSCertFile and TLSKeyFile, both set, make the server speak HTTPS.
	// They are read at start and again by Reload.
	TLSCertFile, TLSKeyFile string
	// PingInterval and PingTimeout bound how long a silently stalled agent
	// connection lingers; zero means DefaultPingInterval and
	// DefaultPingTimeout.
	PingInterval, PingTimeout time.Duration
	// PinMin and PinMax bound an admin's pinned weight: the fleet's weight
	// range. Zero means the fleet's default range.
	PinMin, PinMax float64
	// TrustedProxies are the peers whose X-Forwarded-For is believed when
	// the server counts failed authentications per client address. Empty:
	// the TCP peer is the client, so everyone behind one proxy shares a
	// count (and, since a right token is never limited, only the wrong
	// tokens among them are slowed down).
	TrustedProxies []netip.Prefix
	// AdvertiseAllow lists the addresses nodes may offer gateways besides
	// the one each connects from (advertise_allow; see advertise.go).
	AdvertiseAllow []AllowRule
	// Nodes decides which connections may speak for a node name; nil
	// means a registry that keeps nothing across restarts.
	Nodes *nodes.Registry
	// Audit records admin actions; nil means a log that keeps nothing
	// across restarts.
	Audit *audit.Log
	// State is backed up by GET /api/v1/backup; nil: that route answers
	// 501 (a coordinator that keeps no state file).
	State Backuper
	// Caps on concurrent connections by kind; zero takes the defaults
	// (DefaultMaxAgentConnections...).
	MaxAgentConnections, MaxEventStreams, MaxAPIRequests int
}

// Tokens are the secrets the server checks, as read from the
// configuration and its token files. Each may hold several tokens, one a
// line (settings.SplitTokens), as a token file does during a rotation;
// any of them is accepted.
type Tokens struct {
	Agent  string // required
	Admin  string // empty: admin actions are refused
	Viewer string // empty: reads need no token
}

// TLS reports whether the server serves HTTPS.
func (o Options) TLS() bool { return o.TLSCertFile != "" && o.TLSKeyFile != "" }

// check refuses tokens that would lock the agents out or let an agent act
// as an admin.
func (t Tokens) check() error {
	switch {
	case t.Agent == "":
		return errors.New("no agent token configured")
	case slices.ContainsFunc(settings.SplitTokens(t.Admin), func(a string) bool { return slices.Contains(settings.SplitTokens(t.Agent), a) }):
		return errors.New("the admin token must differ from the agent token, or every agent could act as an admin")
	}
	return nil
}

// Agent connection liveness defaults.
const (
	DefaultPingInterval = 10 * time.Second
	DefaultPingTimeout  = 5 * time.Second
)

// limits are the server's bounds and timers; tests shrink them.
type limits struct {
	maxBody           int64         // API request bodies
	helloTimeout      time.Duration // first message must arrive within
	queueSize         int           // outgoing messages per agent
	writeTimeout      time.Duration // one websocket write
	pingEvery         time.Duration
	pingTimeout       time.Duration
	msgRate           float64       // agent messages per second...
	msgBurst          float64       // ...with this burst
	snapshotSeconds   int           // heartbeat asked of agents in Welcome
	tickEvery         time.Duration // fleet.Tick
	sseMinGap         time.Duration // coalescing of the event stream
	ssePingEvery      time.Duration
	sseWriteTimeout   time.Duration
	shutdownTimeout   time.Duration
	apiWriteTimeout   time.Duration // one API answer, written whole
	agentCheckConns   int           // agent-check exchanges at once; 0: agentCheckMaxConns
	agentCheckTimeout time.Duration // one agent-check exchange; 0: agentCheckTimeout
}

func defaultLimits() limits {
	return limits{
		maxBody:         64 << 10,
		helloTimeout:    10 * time.Second,
		queueSize:       64,
		writeTimeout:    10 * time.Second,
		pingEvery:       DefaultPingInterval,
		pingTimeout:     DefaultPingTimeout,
		msgRate:         50,
		msgBurst:        100,
		snapshotSeconds: 15,
		// A quarter second, so a worker goes offline (and gateways stop
		// sending to it) within the offline grace plus a beat, not plus a
		// whole second; a Tick with nothing due returns at once.
		tickEvery:       250 * time.Millisecond,
		sseMinGap:       250 * time.Millisecond,
		ssePingEvery:    15 * time.Second,
		sseWriteTimeout: 10 * time.Second,
		shutdownTimeout: 10 * time.Second,
		apiWriteTimeout: 30 * time.Second,
	}
}

// Server serves one coordinator. Create it with New, then call Run once.
type Server struct {
	opts    Options
	fleet   fleetAPI
	log     hclog.Logger
	lim     limits
	metrics *metrics
	auth    *authLimiter
	hub     *hub
	caps    caps
	addrs   *addrPolicy

	// The secrets in force; Reload swaps them whole, so a request sees
	// either the old set or the new one. cert is nil without TLS.
	tok  atomic.Pointer[Tokens]
	cert atomic.Pointer[tls.Certificate]

	// base outlives requests: agent connections hang off it.
	base       context.Context
	cancelBase context.CancelFunc
	stopping   chan struct{} // closed when shutdown starts
	ran        atomic.Bool

	handlerOnce sync.Once
	handler     http.Handler
}

// New builds a server over f.
func New(opts Options, f *fleet.Fleet, logger hclog.Logger) (*Server, error) {
	if f == nil {
		return nil, errors.New("server: nil fleet")
	}
	return newServer(opts, f, logger)
}

func newServer(opts Options, f fleetAPI, logger hclog.Logger) (*Server, error) {
	if err := opts.Tokens.check(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if opts.PinMin == 0 && opts.PinMax == 0 {
		def := fleet.DefaultConfig()
		opts.PinMin, opts.PinMax = def.WeightMin, def.WeightMax
	}
	s := &Server{
		opts:     opts,
		fleet:    f,
		log:      logger.Named("server"),
		lim:      defaultLimits(),
		stopping: make(chan struct{}),
	}
	if opts.PingInterval > 0 {
		s.lim.pingEvery = opts.PingInterval
	}
	if opts.PingTimeout > 0 {
		s.lim.pingTimeout = opts.PingTimeout
	}
	tokens := opts.Tokens
	s.tok.Store(&tokens)
	s.opts.Tokens = Tokens{} // s.tokens() is the one in force
	if opts.TLS() {
		cert, err := loadCert(opts)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		s.cert.Store(cert)
	}
	if s.opts.Nodes == nil {
		reg, err := nodes.New(nodes.DefaultConfig(), nodes.Memory{}, nil, time.Now, logger)
		if err != nil {
			return nil, err
		}
		s.opts.Nodes = reg
	}
	if s.opts.Audit == nil {
		s.opts.Audit = audit.New(nil, nil, time.Now, logger)
	}
	s.base, s.cancelBase = context.WithCancel(context.Background())
	s.auth = newAuthLimiter(time.Now)
	s.caps = newCaps(opts)
	s.addrs = newAddrPolicy(opts.AdvertiseAllow)
	s.hub = newHub(s)
	s.metrics = newMetrics(s)
	if opts.Tokens.Admin == "" {
		s.log.Warn("no admin token configured: admin actions (pin, probe, admit, hold) are refused")
	}
	return s, nil
}

// tokens are the tokens in force.
func (s *Server) tokens() Tokens { return *s.tok.Load() }

// loadCert reads the certificate and key named in opts.
func loadCert(opts Options) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(opts.TLSCertFile, opts.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", opts.TLSCertFile, opts.TLSKeyFile, err)
	}
	return &cert, nil
}

// Reload puts tokens and the TLS certificate and key, read again from
// their files, in force. Connections already open stay open; new requests
// and TLS handshakes use the new values. When anything is wrong (a
// certificate that does not load, tokens that fail check) nothing
// changes and the error says why, so a bad file never locks anyone out.
func (s *Server) Reload(tokens Tokens) error {
	if err := tokens.check(); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	var cert *tls.Certificate
	if s.opts.TLS() {
		var err error
		if cert, err = loadCert(s.opts); err != nil {
			return fmt.Errorf("reload: %w", err)
		}
	}
	s.tok.Store(&tokens)
	if cert != nil {
		s.cert.Store(cert)
	}
	return nil
}

// Run serves on ln until ctx ends, then shuts down: agents are told the
// coordinator restarts, event streams end, API requests drain. It also
// drives the fleet's clock. A cancelled ctx is a clean stop (nil).
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("server: Run called twice")
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		// No WriteTimeout: event streams are long; each SSE write has its own deadline.
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    s.log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
		BaseContext: func(net.Listener) context.Context { return s.base },
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Each handshake takes the certificate in force, so Reload
			// swaps it without a restart.
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.cert.Load(), nil },
		},
	}
	served := make(chan error, 1)
	ln = &warnListener{Listener: ln, log: s.log}
	go func() {
		var err error
		if s.opts.TLS() {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		served <- err
	}()

	tickCtx, stopTick := context.WithCancel(ctx)
	var ticking sync.WaitGroup
	ticking.Go(func() { s.tickLoop(tickCtx) })

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
		serveErr = fmt.Errorf("serve: %w", serveErr)
	}
	stopTick()
	ticking.Wait()

	s.log.Info("shutting down")
	close(s.stopping)
	s.hub.shutdown(s.lim.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), s.lim.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		s.log.Warn("http shutdown incomplete", "error", err)
		_ = srv.Close()
	}
	s.cancelBase()
	if serveErr == nil {
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr = fmt.Errorf("serve: %w", err)
		}
	}
	return serveErr
}

func (s *Server) tickLoop(ctx context.Context) {
	t := time.NewTicker(s.lim.tickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.hub.route(s.fleet.Tick())
			s.opts.Nodes.Tick(s.hub.connected, s.fleet.ForgetNode) // forget_nodes_after forgets as a release does
		}
	}
}

// AgentsConnected is the number of agents that have said hello.
func (s *Server) AgentsConnected() int { return s.hub.count() }
