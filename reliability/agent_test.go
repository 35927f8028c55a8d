package reliability

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent"
	"heft/agent/config"
	"heft/shared/wire"
)

// noGPUs is a gpu.Source for a host without GPUs.
type noGPUs struct{}

func (noGPUs) Devices(ctx context.Context) ([]wire.GPU, error) { return nil, ctx.Err() }
func (noGPUs) Close() error                                    { return nil }

// simAgent is heft-agent's service as `heft-agent run` assembles it
// (agent.Run), on a host without GPUs, counting the probes the
// coordinator asks of it per capacity key.
type simAgent struct {
	mu     sync.Mutex
	probes map[string]int
}

// startSimAgent runs an agent for engines until the test ends.
func startSimAgent(t *testing.T, coordURL, node string, engines []config.Engine) *simAgent {
	return startSimAgentWith(t, coordURL, node, engines, nil)
}

// startSimAgentWith is startSimAgent with a tweak of the configuration and
// more options.
func startSimAgentWith(t *testing.T, coordURL, node string, engines []config.Engine, tweak func(*config.Config), opts ...agent.Option) *simAgent {
	t.Helper()
	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token = coordURL, agentToken
	cfg.Node.Name, cfg.Engines = node, engines
	cfg.StateDir = t.TempDir()
	cfg.PollInterval = 100 * time.Millisecond
	if tweak != nil {
		tweak(&cfg)
	}
	a := &simAgent{probes: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		opts := append([]agent.Option{agent.WithGPUs(noGPUs{}), agent.WithProbeHook(func(req wire.ProbeRequest) {
			a.mu.Lock()
			a.probes[req.CapacityKey]++
			a.mu.Unlock()
		})}, opts...)
		err := agent.Run(ctx, cfg, hclog.NewNullLogger(), opts...)
		if err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return a
}

// probeCounts returns a copy of the probes run per capacity key.
func (a *simAgent) probeCounts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.probes)
}
