package reliability

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/link"
	"heft/agent/probe"
	"heft/shared/wire"
)

// noGPUs is a gpu.Source for a host without GPUs.
type noGPUs struct{}

func (noGPUs) Devices(ctx context.Context) ([]wire.GPU, error) { return nil, ctx.Err() }
func (noGPUs) Close() error                                    { return nil }

// simAgent is heft-agent's run loop assembled in-process from its own
// packages, as agent/cli's run does: the collector follows the engines'
// logs and reads them, the link reports, and probes go through the probe
// package against the engine. It counts probes per capacity key.
type simAgent struct {
	node string
	col  *collect.Collector

	mu     sync.Mutex
	last   wire.Snapshot
	probes map[string]int
	cached int
}

// startSimAgent runs an agent for engines until the test ends.
func startSimAgent(t *testing.T, coordURL, node string, engines []collect.EngineSpec) *simAgent {
	t.Helper()
	logger := hclog.NewNullLogger()
	col, err := collect.New(collect.Config{Node: node, Engines: engines}, noGPUs{}, logger)
	if err != nil {
		t.Fatalf("collector: %v", err)
	}
	a := &simAgent{node: node, col: col, probes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	col.Start(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := link.Run(ctx, link.Config{URL: coordURL, Token: agentToken, Node: node, AgentVersion: "reliability",
			Host:      wire.Host{Hostname: node, OS: "linux", Arch: "amd64"},
			PollEvery: 100 * time.Millisecond, Significant: collect.Significant}, a, logger)
		if err != nil {
			t.Errorf("link.Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		col.Wait()
	})
	return a
}

func (a *simAgent) Snapshot(ctx context.Context) wire.Snapshot {
	s := a.col.Snapshot(ctx)
	a.mu.Lock()
	a.last = s
	a.mu.Unlock()
	return s
}

func (a *simAgent) Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
	client, ok := a.col.Engine(req.CapacityKey)
	a.mu.Lock()
	a.probes[req.CapacityKey]++
	model := ""
	for _, e := range a.last.Engines {
		if e.CapacityKey == req.CapacityKey {
			model = e.Model
		}
	}
	a.mu.Unlock()
	if !ok {
		return wire.Measurement{}, fmt.Errorf("no engine has capacity key %q", req.CapacityKey)
	}
	return probe.Run(ctx, probe.Config{URL: client.URL(), Kind: client.Kind(), Model: model,
		CapacityKey: req.CapacityKey, Node: a.node, Trigger: req.Reason,
		RequireIdle: req.Reason == wire.ReasonScheduled, Load: client.Load,
		ReadyTimeout: 20 * time.Second, BurstTimeout: time.Minute})
}

func (a *simAgent) Cached(m wire.CachedMeasurement) {
	a.mu.Lock()
	a.cached++
	a.mu.Unlock()
}

// probeCounts returns a copy of the probes run per capacity key.
func (a *simAgent) probeCounts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.probes))
	for k, v := range a.probes {
		out[k] = v
	}
	return out
}
