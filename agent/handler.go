package agent

import (
	"context"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/gpu"
	"heft/agent/probe"
	"heft/shared/wire"
)

// Handler answers the link (link.Handler): snapshots from the collector,
// probes through the probe package. It is safe for concurrent use.
type Handler struct {
	cfg     config.Config
	col     *collect.Collector
	gpus    gpu.Source
	log     hclog.Logger
	onProbe func(wire.ProbeRequest)

	mu   sync.Mutex
	last wire.Snapshot
}

// NewHandler returns the Handler over a collector and a GPU source; cfg
// gives the node name and the probe's shape.
func NewHandler(cfg config.Config, col *collect.Collector, gpus gpu.Source, logger hclog.Logger) *Handler {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Handler{cfg: cfg, col: col, gpus: gpus, log: logger}
}

// Snapshot returns the collector's snapshot and keeps it: the probe needs
// each engine's model and GPUs as last reported.
func (h *Handler) Snapshot(ctx context.Context) wire.Snapshot {
	s := h.col.Snapshot(ctx)
	h.mu.Lock()
	h.last = s
	h.mu.Unlock()
	return s
}

// Probe measures the engine with req's capacity key. Scheduled probes
// wait for an idle engine; registration and on-demand ones do not (a new
// worker has no measurement to fall back on, and an admin asked).
func (h *Handler) Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
	if h.onProbe != nil {
		h.onProbe(req)
	}
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
func (h *Handler) Cached(m wire.CachedMeasurement) {
	h.log.Info("coordinator holds a fresh measurement", "capacity_key", m.Measurement.CapacityKey,
		"throughput_tps", m.Measurement.ThroughputTPS, "expires_at", m.ExpiresAt)
}
