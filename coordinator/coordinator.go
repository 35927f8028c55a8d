// Package coordinator assembles heft-coordinator from one config.Config:
// the state store, the fleet over it and the server in front of it.
// heft-coordinator's main, the end-to-end and reliability tests, the
// dashboard's harness and the bench all start a coordinator through New
// and Run, so that what they run is what ships.
package coordinator

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/coordinator/audit"
	"heft/coordinator/config"
	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/coordinator/server"
	"heft/coordinator/store"
	"heft/shared/address"
	"heft/shared/version"
)

// Option adjusts how New builds a coordinator.
type Option func(*options)

type options struct {
	logger hclog.Logger
	now    func() time.Time
}

// WithLogger sets the root logger; each part names itself under it. The
// default discards everything.
func WithLogger(l hclog.Logger) Option { return func(o *options) { o.logger = l } }

// WithClock sets the fleet's clock (time.Now by default), for tests that
// step through grace periods and schedules.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Coordinator is one assembled heft-coordinator. Create it with New, then
// call Run once.
type Coordinator struct {
	cfg   config.Config
	log   hclog.Logger
	st    *store.Bolt
	fleet *fleet.Fleet
	srv   *server.Server

	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, opens the state under cfg.StateDir and builds the
// fleet and the server over it. When it fails nothing stays open.
func New(cfg config.Config, opts ...Option) (*Coordinator, error) {
	o := options{logger: hclog.NewNullLogger()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	var storeOpts []store.Option
	if cfg.Init {
		storeOpts = append(storeOpts, store.Init())
	}
	st, err := store.Open(cfg.StateDir, o.logger, storeOpts...)
	if err != nil {
		return nil, err
	}
	f, err := fleet.New(cfg.Fleet, st, o.now, o.logger)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	if err := f.BindDeployments(cfg.DPDeployments); err != nil {
		_ = st.Close()
		return nil, err
	}
	records, err := st.LoadNodes()
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	reg, err := nodes.New(nodesConfig(cfg, st, o.logger), st, records, o.now, o.logger)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	so, err := serverOptions(cfg)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	so.Nodes = reg
	so.State = st
	entries, err := st.LoadAudit()
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	so.Audit = audit.New(st, entries, o.now, o.logger)
	srv, err := server.New(so, f, o.logger)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return &Coordinator{cfg: cfg, log: o.logger, st: st, fleet: f, srv: srv}, nil
}

// nodesConfig is the registry's settings with approve_new_nodes, where the
// configuration does not set it, as the state file was installed with:
// on for a new install, off for an upgrade from before that default.
func nodesConfig(cfg config.Config, st *store.Bolt, logger hclog.Logger) nodes.Config {
	nc := cfg.Nodes
	if cfg.ApproveNewNodesSet() {
		return nc
	}
	nc.ApproveNew = st.ApproveNewNodesByDefault()
	why := "a state file from before approval was the default (an upgrade) keeps it off"
	if nc.ApproveNew {
		why = "a new install approves new node names unless approve_new_nodes = false"
	}
	logger.Info("approve_new_nodes is not set: "+why, "approve_new_nodes", nc.ApproveNew)
	return nc
}

// serverOptions are the server's settings with what New adds to them:
// the tokens (token files read), the parsed proxies and advertise rules,
// and the fleet's weight range as the range an admin may pin within.
func serverOptions(cfg config.Config) (server.Options, error) {
	tokens, err := cfg.ReadTokens()
	if err != nil {
		return server.Options{}, err
	}
	proxies, err := cfg.Proxies()
	if err != nil {
		return server.Options{}, err
	}
	allow, err := server.ParseAllow(cfg.AdvertiseAllow)
	if err != nil {
		return server.Options{}, err
	}
	so := cfg.Server
	so.Tokens, so.TrustedProxies, so.AdvertiseAllow = server.Tokens(tokens), proxies, allow
	so.PinMin, so.PinMax = cfg.Fleet.WeightMin, cfg.Fleet.WeightMax
	return so, nil
}

// Run serves on ln until ctx ends, then shuts the server down and closes
// the state. A cancelled ctx is a clean stop (nil). An error closing the
// state is logged; Close returns it again.
func (c *Coordinator) Run(ctx context.Context, ln net.Listener) error {
	if host, _, _ := net.SplitHostPort(c.cfg.Listen); !c.cfg.TLS() && !address.IsLoopback(host) {
		c.log.Warn("listening without TLS on a non-loopback address: tokens and fleet data cross the network in clear text; "+
			"set tls_cert_file and tls_key_file, or put a TLS proxy in front", "listen", ln.Addr().String())
	}
	c.log.Info("listening", "address", ln.Addr().String(), "tls", c.cfg.TLS(), "state_dir", c.cfg.StateDir, "version", version.Version)
	stopChecks, err := c.agentChecks(ctx)
	if err != nil {
		if cerr := c.Close(); cerr != nil {
			c.log.Error("close state", "error", cerr)
		}
		return err
	}
	err = c.srv.Run(ctx, ln)
	stopChecks()
	if cerr := c.Close(); cerr != nil {
		c.log.Error("close state", "error", cerr)
	}
	if err == nil {
		c.log.Info("stopped")
	}
	return err
}

// Reload reads the token files and the TLS certificate and key again and
// puts them in force without dropping a connection (SIGHUP does this).
// Tokens set in the configuration itself, not in a file, stay as they
// are. When a file is unreadable or its value is refused, nothing changes:
// the error is logged and returned, and the old tokens and certificate
// keep working.
func (c *Coordinator) Reload() error {
	tokens, err := c.cfg.ReadTokens()
	if err == nil {
		err = c.cfg.CheckTokens(tokens)
	}
	if err == nil {
		err = c.srv.Reload(server.Tokens(tokens))
	}
	if err != nil {
		c.log.Error("reload failed: the tokens and TLS certificate in force stay", "error", err)
		return err
	}
	var files []string
	for _, f := range []string{c.cfg.AgentTokenFile, c.cfg.AdminTokenFile, c.cfg.ViewerTokenFile, c.cfg.Server.TLSCertFile, c.cfg.Server.TLSKeyFile} {
		if f != "" {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		c.log.Info("reload: no token or certificate files are configured, so nothing changed")
		return nil
	}
	c.log.Info("reloaded tokens and TLS certificate", "files", files)
	return nil
}

// agentChecks starts the HAProxy agent-check responder when the
// configuration asks for one; stop ends it and waits.
func (c *Coordinator) agentChecks(ctx context.Context) (stop func(), err error) {
	if c.cfg.AgentCheckListen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", c.cfg.AgentCheckListen)
	if err != nil {
		return nil, fmt.Errorf("agent_check_listen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.srv.ServeAgentCheck(ctx, ln); err != nil {
			c.log.Error("agent checks stopped", "error", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}

// Close closes the state; Run does so when it returns, so only a
// coordinator that is never run needs it. It is safe to call again, and
// returns the first call's error.
func (c *Coordinator) Close() error {
	c.closeOnce.Do(func() {
		if err := c.st.Close(); err != nil {
			c.closeErr = fmt.Errorf("close state: %w", err)
		}
	})
	return c.closeErr
}

// Fleet is the coordinator's fleet.
func (c *Coordinator) Fleet() *fleet.Fleet { return c.fleet }

// Server is the coordinator's network face.
func (c *Coordinator) Server() *server.Server { return c.srv }
