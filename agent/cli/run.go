package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/gpu"
	"heft/agent/host"
	"heft/agent/link"
	"heft/agent/probe"
	"heft/shared/logging"
	"heft/shared/settings"
	"heft/shared/version"
	"heft/shared/wire"
)

// runRun is the agent service: it collects facts, measures engines when the
// coordinator asks, and keeps the link to the coordinator until SIGINT or
// SIGTERM. Exit 0 on a signal, 1 when it cannot run, 2 on bad flags, 78
// (settings.ExitConfig) on a bad configuration.
func runRun(args []string, stdio IO) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runAgent(ctx, args, os.Getenv, stdio)
}

// runAgent is runRun under a caller's context, for tests.
func runAgent(ctx context.Context, args []string, env func(string) string, stdio IO) int {
	cfg, err := config.Load("", args, env)
	if err != nil {
		return settings.Exit("heft-agent run", err, config.Usage, stdio.Out, stdio.Err)
	}
	token, err := cfg.Token()
	var tlsCfg *tls.Config
	if err == nil {
		tlsCfg, err = cfg.TLSConfig()
	}
	if err != nil {
		return settings.Exit("heft-agent run", err, config.Usage, stdio.Out, stdio.Err)
	}

	logger := logging.New("heft-agent", cfg.Log.Level, cfg.Log.JSON, stdio.Err)
	cfg.LogSettings(logger)
	if w := cfg.PlainTextWarning(); w != "" {
		// Loud on purpose: on stderr as a banner and in the log.
		fmt.Fprintf(stdio.Err, "\n%s\n%s\n%s\n\n", strings.Repeat("!", 72), w, strings.Repeat("!", 72))
		logger.Warn("agent token sent in plain text", "url", cfg.Coordinator.URL)
	}
	logger.Info("starting", "version", version.Version, "node", cfg.Node.Name, "coordinator", cfg.Coordinator.URL,
		"engines", len(cfg.Engines), "config", cfg.Path)

	gpus, gpuErr := gpu.Open(logger.Named("gpu"))
	gpuError := ""
	if gpuErr != nil {
		gpuError = gpuErr.Error()
		logger.Warn("GPU facts unavailable; carrying on without them", "error", gpuErr)
	}
	defer gpus.Close()

	specs := make([]collect.EngineSpec, len(cfg.Engines))
	for i, e := range cfg.Engines {
		specs[i] = collect.EngineSpec{Kind: e.Kind, URL: e.URL, Log: e.Log, Model: e.Model}
	}
	col, err := collect.New(collect.Config{Node: cfg.Node.Name, Engines: specs, Interval: cfg.PollInterval,
		GPUError: gpuError}, gpus, logger)
	if err != nil {
		fmt.Fprintf(stdio.Err, "heft-agent run: %v\n", err)
		return 1
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

	handler := &agentHandler{cfg: cfg, col: col, gpus: gpus, log: logger.Named("probe")}
	err = link.Run(ctx, link.Config{
		URL: cfg.Coordinator.URL, Token: token, TLS: tlsCfg,
		Node: cfg.Node.Name, AgentVersion: version.Version, Host: h,
		SnapshotEvery: cfg.SnapshotInterval, PollEvery: cfg.PollInterval,
		Significant: collect.Significant,
	}, handler, logger.Named("link"))
	if err != nil {
		logger.Error("cannot run the link to the coordinator", "error", err)
		return 1
	}
	logger.Info("stopped")
	return 0
}

// agentHandler answers the link: snapshots from the collector, probes
// through the probe package.
type agentHandler struct {
	cfg  config.Config
	col  *collect.Collector
	gpus gpu.Source
	log  hclog.Logger

	mu   sync.Mutex
	last wire.Snapshot
}

func (h *agentHandler) Snapshot(ctx context.Context) wire.Snapshot {
	s := h.col.Snapshot(ctx)
	h.mu.Lock()
	h.last = s
	h.mu.Unlock()
	return s
}

// Probe measures the engine with req's capacity key. Scheduled probes
// wait for an idle engine; registration and on-demand ones do not (a new
// worker has no measurement to fall back on, and an admin asked).
func (h *agentHandler) Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
	client, ok := h.col.Engine(req.CapacityKey)
	if !ok {
		return wire.Measurement{}, fmt.Errorf("no engine on this node has capacity key %q", req.CapacityKey)
	}
	model, uuids := client.Config().Model, []string(nil)
	h.mu.Lock()
	for _, e := range h.last.Engines {
		if e.CapacityKey == req.CapacityKey {
			model, uuids = e.Model, e.GPUUUIDs
		}
	}
	h.mu.Unlock()
	return probe.Run(ctx, probe.Config{
		URL: client.URL(), Kind: client.Kind(), Model: model,
		Concurrency: h.cfg.Probe.Concurrency, Tokens: h.cfg.Probe.Tokens, Prompt: h.cfg.Probe.Prompt,
		CapacityKey: req.CapacityKey, Node: h.cfg.Node.Name, Trigger: req.Reason,
		RequireIdle: req.Reason == wire.ReasonScheduled,
		Load:        client.Load, GPUs: h.gpus.Devices, GPUUUIDs: uuids,
	})
}

// Cached notes the coordinator's fresh measurement; the coordinator keeps
// the cache and decides when to measure again.
func (h *agentHandler) Cached(m wire.CachedMeasurement) {
	h.log.Info("coordinator holds a fresh measurement", "capacity_key", m.Measurement.CapacityKey,
		"throughput_tps", m.Measurement.ThroughputTPS, "expires_at", m.ExpiresAt)
}
