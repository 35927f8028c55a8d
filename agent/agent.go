// Package agent assembles heft-agent's service from its parts: the GPU
// source, the collector that follows the engines' logs and builds
// snapshots, the host facts, and the link to the coordinator, whose probe
// requests the Handler answers through the probe package; all of them
// report what fails to one status board, which logs each change once and
// which /healthz and /metrics (config listen) read. Run is what
// `heft-agent run` runs; tests and benchmarks run the same assembly, with
// Options for what they must replace.
package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/engine"
	"heft/agent/gpu"
	"heft/agent/host"
	"heft/agent/link"
	"heft/agent/logsource"
	"heft/agent/status"
	"heft/shared/version"
	"heft/shared/wire"
)

// Option changes what Run assembles.
type Option func(*options)

type options struct {
	gpus    gpu.Source
	onProbe func(wire.ProbeRequest)
	getenv  func(string) string // the environment systemd's notify socket is read from
	reread  <-chan struct{}
	// passiveWindow replaces the passive and the pace window (tests).
	passiveWindow time.Duration
	staleAfter    time.Duration // replaces probe.StaleLoadAfter in snapshots (tests)
}

// WithReload reads token_file again on each receive from ch (heft-agent
// run sends one on SIGHUP). The link also reads it again when the
// coordinator refuses the token in use.
func WithReload(ch <-chan struct{}) Option {
	return func(o *options) { o.reread = ch }
}

// WithGPUs reads GPU facts from src instead of opening this host's GPUs
// (gpu.Open). Run does not close src.
func WithGPUs(src gpu.Source) Option {
	return func(o *options) { o.gpus = src }
}

// WithProbeHook calls fn with every probe request the coordinator sends,
// before the probe runs (or is refused), from the probe's goroutine.
func WithProbeHook(fn func(wire.ProbeRequest)) Option {
	return func(o *options) { o.onProbe = fn }
}

// withPassiveWindow shortens the passive capacity and pace windows (tests).
func withPassiveWindow(d time.Duration) Option {
	return func(o *options) { o.passiveWindow = d }
}

// withStaleAfter shortens how long a busy load and its counters stand
// still before snapshots call the load stale (tests).
func withStaleAfter(d time.Duration) Option {
	return func(o *options) { o.staleAfter = d }
}

// withEnv reads systemd's notify variables from getenv instead of the
// process environment (tests).
func withEnv(getenv func(string) string) Option {
	return func(o *options) { o.getenv = getenv }
}

// Run runs the agent until ctx ends, and returns nil then. It returns an
// error, before starting anything, for a configuration it cannot use.
// logger is the root logger; each part names itself under it.
func Run(ctx context.Context, cfg config.Config, logger hclog.Logger, opts ...Option) error {
	o := options{getenv: os.Getenv}
	for _, opt := range opts {
		opt(&o)
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("the configuration has problems: %w", err)
	}
	token, err := cfg.Token()
	if err != nil {
		return err
	}
	tlsCfg, err := cfg.TLSConfig()
	if err != nil {
		return err
	}
	coordURL, _, err := cfg.AgentURL()
	if err != nil {
		return err
	}
	creds, err := link.CredentialFile(cfg.StateDir, cfg.Node.Name)
	if err != nil {
		return err
	}
	// A port that is taken stops the start before anything runs: an
	// operator who asked for /healthz relies on it.
	var ln net.Listener
	if cfg.Listen != "" {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("cannot serve /metrics and /healthz: %w", err)
		}
		defer ln.Close()
	}
	if cfg.PlainTextWarning() != "" {
		logger.Warn("agent token sent in plain text", "url", coordURL)
	}
	logger.Info("starting", "version", version.Version, "node", cfg.Node.Name, "coordinator", coordURL,
		"engines", len(cfg.Engines), "config", cfg.Path)
	if len(cfg.Engines) == 0 {
		// Running with nothing to measure is allowed (the node shows up
		// for approval) but is rarely what the operator meant.
		logger.Warn("no engines configured: this agent reports its node and nothing to measure; add [[engine]] tables to the config",
			"config", cfg.Path)
	}
	board := status.New()
	// Everything below ends with ctx, or when the link returns.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	gpus, gpuError := o.gpus, ""
	if gpus == nil {
		src, err := gpu.Open(logger)
		if err != nil {
			gpuError = err.Error()
			logger.Warn("GPU facts unavailable; carrying on without them", "error", err)
		}
		defer src.Close()
		gpus = src
	}

	col, err := collect.New(collect.Config{Node: cfg.Node.Name, Engines: Engines(cfg), GPUError: gpuError, LogOptions: LogOptions(cfg),
		Status: board}, gpus, logger)
	if err != nil {
		return err
	}
	col.Start(ctx)
	defer col.Wait()

	h, err := host.Collect(ctx)
	if err != nil {
		logger.Warn("host facts incomplete", "error", err)
	}
	if h.Hostname == "" {
		h.Hostname = cfg.Node.Name
	}

	handler := NewHandler(cfg, col, gpus, board, logger)
	handler.onProbe, handler.passiveWindow, handler.staleAfter = o.onProbe, o.passiveWindow, o.staleAfter
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { handler.keepFresh(ctx, cfg.PollInterval) })
	w := &watcher{node: cfg.Node.Name, coordURL: coordURL, h: handler, col: col, board: board,
		started: time.Now(), stuckAfter: stuckAfter(cfg.PollInterval)}
	if ln != nil {
		serveLog := logger.Named("serve")
		serveLog.Info("serving /metrics and /healthz", "addr", ln.Addr().String())
		wg.Go(func() { w.serve(ctx, ln, serveLog) })
	}
	if sd := systemdFromEnv(o.getenv, logger.Named("systemd")); sd != nil {
		wg.Go(func() { sd.run(ctx, w.stuck) })
	}
	err = link.Run(ctx, link.Config{
		URL: coordURL, Token: token, TLS: tlsCfg, Status: board, Credentials: creds,
		ReadToken: readToken(cfg), Reread: o.reread,
		Node: cfg.Node.Name, AgentVersion: version.Version, Host: h,
		SnapshotEvery: cfg.SnapshotInterval, PollEvery: cfg.PollInterval,
		Significant: collect.Significant,
	}, handler, logger)
	cancel()
	if err != nil {
		return fmt.Errorf("cannot run the link to the coordinator: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// readToken reads token_file again, for the link; nil for a token given
// in the configuration, which only a restart changes.
func readToken(cfg config.Config) func() (string, error) {
	if cfg.Coordinator.TokenFile == "" {
		return nil
	}
	return cfg.Token
}

// LogOptions returns where the config says this host keeps journals,
// Docker's socket and data, and pod logs, as the log sources take them.
func LogOptions(cfg config.Config) logsource.Options {
	l := cfg.EngineLogs
	return logsource.Options{JournalDirectory: l.JournalDirectory, DockerSocket: l.DockerSocket, DockerRoot: l.DockerRoot, PodsRoot: l.PodsRoot}
}

// Engines returns the configured engines as the engine package takes
// them; each one's Node is the config's node name.
func Engines(cfg config.Config) []engine.Config {
	out := make([]engine.Config, len(cfg.Engines))
	for i, e := range cfg.Engines {
		out[i] = engine.Config{Kind: e.Kind, URL: e.URL, Log: e.Log, Model: e.Model, AdvertiseURL: e.AdvertiseURL, Node: cfg.Node.Name}
	}
	return out
}
