package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/engine"
	"heft/agent/gpu"
	"heft/agent/link"
	"heft/agent/metrics"
	"heft/agent/probe"
	"heft/agent/status"
	"heft/shared/wire"
)

// Handler answers the link (link.Handler): snapshots from the collector,
// probes through the probe package. It is safe for concurrent use.
type Handler struct {
	cfg      config.Config
	col      *collect.Collector
	gpus     gpu.Source
	log      hclog.Logger
	probeLog hclog.Logger
	probes   *status.Reporter // each engine's last probe on the board
	onProbe  func(wire.ProbeRequest)

	inflight atomic.Int32 // snapshots being taken now
	dropping atomic.Bool  // the last snapshot had readings dropped (selfcheck.go)

	mu     sync.Mutex
	last   wire.Snapshot
	lastAt time.Time                   // when last was taken; zero before the first
	counts map[string]map[string]int64 // probes by engine URL and outcome
	held   map[string]held             // measurements to offer a coordinator, by capacity key (held.go)
	// probing holds the capacity key of the probe running on each engine,
	// by its sockets (config.EngineSockets): the link runs one probe per
	// key, but a key changes with the engine's launch, and one engine may
	// be reached by two spellings of its URL; two bursts on one engine
	// would each see the other's tokens and both be discarded.
	probing map[string]string
	lookup  config.Lookup // resolves engine host names; tests replace it

	passiveMu     sync.Mutex
	passive       map[string]*passive // passive capacity per capacity key (passive.go)
	paces         map[string]*pace    // pace readings per capacity key (pace.go)
	passiveWindow time.Duration       // tests: replaces both the passive and the pace window; 0: the config's
	passiveGap    time.Duration       // tests: replaces passiveMaxGap
	staleAfter    time.Duration       // tests: replaces probe.StaleLoadAfter in snapshots
}

// NewHandler returns the Handler over a collector and a GPU source; cfg
// gives the node name and the probe's shape, board receives each
// engine's probe outcome (nil: a board of its own).
func NewHandler(cfg config.Config, col *collect.Collector, gpus gpu.Source, board *status.Board, logger hclog.Logger) *Handler {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if board == nil {
		board = status.New()
	}
	probeLog := logger.Named("probe")
	return &Handler{cfg: cfg, col: col, gpus: gpus, log: logger, probeLog: probeLog,
		probes: board.Reporter(status.AreaProbe, "url", probeLog), counts: map[string]map[string]int64{},
		probing: map[string]string{}, lookup: net.DefaultResolver.LookupIPAddr}
}

// Snapshot returns the collector's snapshot and keeps it: the probe needs
// each engine's model and GPUs as last reported, and /metrics shows it.
func (h *Handler) Snapshot(ctx context.Context) wire.Snapshot {
	h.inflight.Add(1)
	defer h.inflight.Add(-1)
	// The facts and the passive counters read one engine's /metrics and
	// live load once between them.
	ctx = engine.ShareReads(ctx)
	s := h.col.Snapshot(ctx)
	h.passiveReadings(ctx, &s)
	if dropped := dropInvalidReadings(&s); len(dropped) > 0 {
		// Loud once, quiet while the same fault lasts (every poll).
		log := h.log.Error
		if h.dropping.Swap(true) {
			log = h.log.Debug
		}
		log("readings dropped from the snapshot: they fail the wire's checks (a bug in the agent; please report it)", "dropped", dropped)
	} else {
		h.dropping.Store(false)
	}
	h.mu.Lock()
	h.last, h.lastAt = s, time.Now()
	h.mu.Unlock()
	return s
}

// lastSnapshot returns the newest snapshot and when it was taken.
func (h *Handler) lastSnapshot() (wire.Snapshot, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last, h.lastAt
}

// Probe measures the engine with req's capacity key: probe.concurrency
// requests per data-parallel rank, so every engine instance is measured
// at the same load. A busy engine is waited for, drained or left alone
// as probe.busy says, whatever asked (a scheduled probe in "wait" mode is
// deferred at once: the coordinator asks again); a burst that the
// engine's own counters show was shared with other traffic is discarded.
// A probe of an engine that another probe (under another key) is still
// measuring or waiting for is deferred too (ErrBusy), and one whose
// engine's key changed meanwhile is discarded.
func (h *Handler) Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
	if h.onProbe != nil {
		h.onProbe(req)
	}
	client, ok := h.col.Engine(req.CapacityKey)
	if !ok {
		return wire.Measurement{}, fmt.Errorf("no engine on this node has capacity key %q", req.CapacityKey)
	}
	sockets := h.sockets(ctx, client.URL())
	if other, busy := h.claim(sockets, req.CapacityKey); busy {
		err := probe.BusyError(fmt.Sprintf("another probe of this engine (capacity key %s) is still running; "+
			"this one is deferred so that the two bursts never share the engine", other))
		if ctx.Err() == nil {
			h.recordProbe(client.URL(), req.CapacityKey, wire.Measurement{}, err)
		}
		return wire.Measurement{}, err
	}
	defer h.release(sockets)

	model, uuids, maxContext, ranks := client.Config().Model, []string(nil), int64(0), 1
	h.mu.Lock()
	for _, e := range h.last.Engines {
		if e.CapacityKey == req.CapacityKey {
			model, uuids, maxContext, ranks = e.Model, e.GPUUUIDs, e.MaxContextTokens(), e.DataParallelRanks()
		}
	}
	h.mu.Unlock()
	pc := h.cfg.Probe
	m, err := probe.Run(ctx, probe.Config{
		URL: client.URL(), Kind: client.Kind(), Model: model,
		Concurrency: min(pc.Concurrency*ranks, probe.MaxConcurrency), Ranks: ranks, Tokens: pc.Tokens, Prompt: pc.Prompt,
		CapacityKey: req.CapacityKey, Node: h.cfg.Node.Name, Trigger: req.Reason,
		RequireIdle: req.Reason == wire.ReasonScheduled, IdleOnly: req.IdleOnly,
		Busy: pc.Busy, BusyWait: pc.BusyWait,
		Drain: func(ctx context.Context) error {
			if !link.SendProbeStatus(ctx, wire.ProbeDraining, "engine busy; drain it at the gateways while it is measured") {
				return errors.New("no coordinator link to ask for the drain")
			}
			h.probeLog.Info("engine busy; asked the coordinator to drain it at the gateways", "url", client.URL())
			return nil
		},
		Counters: client.Counters,
		Stir:     client.Stir, Load: client.Load, GPUs: h.gpus.Devices, GPUUUIDs: uuids, EngineTree: client.Tree,
		OnWaiting: func(w probe.Waiting) {
			msg := "engine not ready; the probe waits"
			if w.Busy {
				msg = "engine busy; the probe waits for it to be idle"
			}
			h.probeLog.Info(msg, "url", w.URL, "reason", w.Reason,
				"waited", w.Waited.Round(time.Second).String(), "waits_up_to", w.Left.Round(time.Second).String()+" more")
		},
		Prefill: pc.Prefill, PrefillConcurrency: pc.PrefillConcurrency, PrefillTokens: pc.PrefillTokens,
		MaxContextTokens: maxContext,
	})
	m.Cause = req.Cause
	if now := h.keyOf(client.URL()); err == nil && m.Valid() && now != "" && now != req.CapacityKey {
		// A probe that waited for a busy engine may end on the engine
		// restarted with other arguments: its number is not the key's.
		err = fmt.Errorf("the engine's capacity key changed from %s to %s while it was probed (restarted with other launch arguments?): "+
			"the measurement is not the old key's, and was discarded", req.CapacityKey, now)
	}
	if ctx.Err() == nil {
		h.recordProbe(client.URL(), req.CapacityKey, m, err)
	}
	return m, err
}

// resolveFor bounds the lookup of an engine's host name before a probe:
// a slow resolver only costs the match of two spellings, never the probe.
const resolveFor = 2 * time.Second

// sockets names the listening sockets the engine at url may be, for the
// one-probe-per-engine slot.
func (h *Handler) sockets(ctx context.Context, url string) []string {
	ctx, cancel := context.WithTimeout(ctx, resolveFor)
	defer cancel()
	return config.EngineSockets(ctx, url, h.lookup)
}

// claim takes the probe slot of every socket for key, unless a probe
// holds one already: then it returns that probe's key and busy.
func (h *Handler) claim(sockets []string, key string) (other string, busy bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range sockets {
		if other, busy := h.probing[s]; busy {
			return other, true
		}
	}
	for _, s := range sockets {
		h.probing[s] = key
	}
	return "", false
}

// release frees the slots claim took.
func (h *Handler) release(sockets []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range sockets {
		delete(h.probing, s)
	}
}

// keyOf returns the capacity key the newest snapshot gives the engine at
// url; "" when it lists none.
func (h *Handler) keyOf(url string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.last.Engines {
		if e.URL == url {
			return e.CapacityKey
		}
	}
	return ""
}

// recordProbe counts a probe's outcome and puts it on the board: a
// failed measurement is one warning with its code and first problem
// (again only when the code changes), a valid one after it an info line.
func (h *Handler) recordProbe(url, key string, m wire.Measurement, err error) {
	outcome := metrics.OutcomeMeasured
	switch {
	case errors.Is(err, probe.ErrBusy):
		outcome = metrics.OutcomeBusy
	case err != nil:
		outcome = metrics.OutcomeError
	case !m.Valid():
		outcome = m.Failure
		if outcome == "" {
			outcome = wire.CodeProbeFailed
		}
		first := "no problem recorded"
		if len(m.Problems) > 0 {
			first = m.Problems[0]
		}
		h.probes.Fail(url, status.Failure{Reason: outcome, Msg: "probe failed", Err: first, Args: []any{"capacity_key", key}})
	default:
		kv := []any{"capacity_key", key, "throughput_tps", m.ThroughputTPS}
		switch p := m.Prefill; {
		case m.PrefillValid():
			kv = append(kv, "prefill_tps", p.ThroughputTPS)
		case p != nil:
			kv = append(kv, "prefill_failure", p.Failure)
		}
		h.probes.OK(url, "probe measured the engine again", kv...)
	}
	h.mu.Lock()
	if h.counts[url] == nil {
		h.counts[url] = map[string]int64{}
	}
	h.counts[url][outcome]++
	h.mu.Unlock()
}

// probeCounts returns a copy of one engine's probe counts by outcome.
func (h *Handler) probeCounts(url string) map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.counts[url])
}
