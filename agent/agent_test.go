package agent

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/agent/config"
	"heft/agent/engine"
	"heft/agent/internal/fakecoord"
	"heft/agent/probe"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const token = "s3cret"

// oneGPU is a host with one idle GPU.
type oneGPU struct{}

func (oneGPU) Devices(context.Context) ([]wire.GPU, error) {
	return []wire.GPU{{Index: 0, UUID: "GPU-test", Name: "NVIDIA L4", MemoryTotal: 23 << 30, MemoryFree: 20 << 30}}, nil
}
func (oneGPU) Close() error { return nil }

// Run assembles the whole agent: the injected GPUs reach the snapshots,
// the engine is read, a probe request is measured through the Handler
// (and the hook sees it), every part names its own logger under the
// root's, and the link closes cleanly when ctx ends.
func TestRunAssemblesTheAgent(t *testing.T) {
	// A context of 2,048 tokens: the prefill burst must send shorter prompts.
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200,
		PrefillTPS: 20000, MaxModelLen: 2048}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	coord := fakecoord.Start(t, token)

	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Coordinator.URL, cfg.Coordinator.Token = coord.URL, token
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: "vllm", URL: s.URL()}}
	cfg.Probe.Concurrency, cfg.Probe.Tokens = 4, 16
	cfg.SnapshotInterval, cfg.PollInterval = 50*time.Millisecond, 100*time.Millisecond

	var mu sync.Mutex
	var hooked []wire.ProbeRequest
	hook := WithProbeHook(func(req wire.ProbeRequest) {
		mu.Lock()
		hooked = append(hooked, req)
		mu.Unlock()
	})
	logs := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "heft-agent", Output: logs, Level: hclog.Debug})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, logger, WithGPUs(oneGPU{}), hook) }()
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()

	var fc *fakecoord.Conn
	select {
	case fc = <-coord.Conns:
	case err := <-done:
		t.Fatalf("Run returned %v before connecting", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not connect")
	}
	var snap *wire.Snapshot
	for snap == nil || snap.Engines[0].CapacityKey == "" || !snap.Engines[0].Ready {
		snap = fc.Next(t, wire.TypeSnapshot).Snapshot
	}
	if len(snap.GPUs) != 1 || snap.GPUs[0].UUID != "GPU-test" || snap.GPUError != "" {
		t.Errorf("GPUs %+v (error %q), want the injected one", snap.GPUs, snap.GPUError)
	}
	key := snap.Engines[0].CapacityKey

	req := wire.ProbeRequest{RequestID: "r1", CapacityKey: key, Reason: wire.ReasonOnDemand}
	fc.Send(t, &req)
	res := fc.Next(t, wire.TypeProbeResult).ProbeResult
	if m := res.Measurement; res.RequestID != "r1" || !m.Valid() || m.OutputTokens != 64 || m.Model != "test/model" || m.Node != "gpu-test" {
		t.Errorf("result %+v", res)
	}
	// The prefill burst ran by default, within what the engine holds.
	if m := res.Measurement; !m.PrefillValid() || m.Prefill.PromptLength != 2048-probe.TemplateMargin-1 {
		t.Errorf("prefill %+v, want prompts of %d tokens", m.Prefill, 2048-probe.TemplateMargin-1)
	}
	mu.Lock()
	if len(hooked) != 1 || hooked[0] != req {
		t.Errorf("hook saw %+v, want the one request", hooked)
	}
	mu.Unlock()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v after cancel, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if code := fc.CloseStatus(t); code != websocket.StatusGoingAway {
		t.Errorf("close code %v, want going away", code)
	}
	for _, name := range []string{"heft-agent.link:", "heft-agent.collect.engine:"} {
		if !strings.Contains(logs.String(), name) {
			t.Errorf("no log line from %s", strings.TrimSuffix(name, ":"))
		}
	}
}

func TestRunRefusesABadConfig(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Engines = []config.Engine{{Kind: "no-such-engine", URL: "http://127.0.0.1:1"}}
	err := Run(context.Background(), cfg, nil, WithGPUs(oneGPU{}))
	if err == nil || !strings.Contains(err.Error(), "no coordinator URL") || !strings.Contains(err.Error(), `unknown kind "no-such-engine"`) {
		t.Errorf("Run = %v, want every problem named", err)
	}
}

func TestEngines(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Node.Name = "n1"
	cfg.Engines = []config.Engine{{Kind: "ollama", URL: "http://127.0.0.1:11434", Model: "qwen3:8b"}, {Kind: "vllm", URL: "http://h:8000", Log: "/var/log/vllm.log"}}
	want := []engine.Config{
		{Kind: "ollama", URL: "http://127.0.0.1:11434", Model: "qwen3:8b", Node: "n1"},
		{Kind: "vllm", URL: "http://h:8000", Log: "/var/log/vllm.log", Node: "n1"},
	}
	got := Engines(cfg)
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Engines = %+v, want %+v", got, want)
	}
}
