package agent

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/config"
	"heft/agent/internal/fakecoord"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// startAgentOn runs a whole agent beside one sim and returns its
// coordinator connection and the engine's first ready snapshot.
func startAgentOn(t *testing.T, s *sim.Server, kind string, edit func(*config.Config), opts ...Option) (*fakecoord.Conn, wire.Engine) {
	t.Helper()
	coord := fakecoord.Start(t, token)
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.Coordinator.URL, cfg.Coordinator.Token = coord.URL, token
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: kind, URL: s.URL()}}
	cfg.Probe.Concurrency, cfg.Probe.Tokens, cfg.Probe.Prefill = 4, 16, false
	cfg.SnapshotInterval, cfg.PollInterval = 50*time.Millisecond, 100*time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	logs := &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}), append(opts, WithGPUs(oneGPU{}))...)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	var fc *fakecoord.Conn
	select {
	case fc = <-coord.Conns:
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("Run returned %v before connecting", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not connect")
	}
	for {
		snap := fc.Next(t, wire.TypeSnapshot).Snapshot
		if e := snap.Engines[0]; e.CapacityKey != "" && e.Ready {
			return fc, e
		}
	}
}

// A data-parallel engine is measured with the burst per rank: a DP2
// engine gets twice the requests, so each rank carries what a DP1
// engine's one rank does, and its own counters confirm no other traffic.
func TestProbePerRankBurst(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200, DP: 2}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fc, eng := startAgentOn(t, s, wire.EngineSGLang, nil)
	fc.Send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: eng.CapacityKey, Reason: wire.ReasonOnDemand})
	m := fc.Next(t, wire.TypeProbeResult).ProbeResult.Measurement
	if !m.Valid() || m.Ranks != 2 || m.Concurrency != 8 || m.Requests != 8 || m.OutputTokens != 8*16 {
		t.Fatalf("valid %v ranks %d concurrency %d requests %d tokens %d; problems %q", m.Valid(), m.Ranks, m.Concurrency, m.Requests, m.OutputTokens, m.Problems)
	}
	if m.EngineGeneratedTokens < int64(m.OutputTokens) {
		t.Errorf("the engine's counter grew by %d over a burst of %d tokens", m.EngineGeneratedTokens, m.OutputTokens)
	}
}

// probe_busy = "drain": the agent finds its engine busy, tells the
// coordinator to drain it (status "draining"), waits for the requests in
// flight to finish, and measures an idle engine.
func TestProbeDrainsABusyEngine(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fc, eng := startAgentOn(t, s, wire.EngineVLLM, func(c *config.Config) { c.Probe.Busy, c.Probe.BusyWait = "drain", time.Minute })

	// A user's long request keeps the engine busy until the gateway
	// would have drained it.
	ctx, cancel := context.WithCancel(t.Context())
	var user sync.WaitGroup
	t.Cleanup(func() { cancel(); user.Wait() })
	body := []byte(`{"model":"test/model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
	user.Go(func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body) // until cancel
			resp.Body.Close()
		}
	})
	testutil.Eventually(t, "the user's request to run", 10*time.Second, func() bool { r, _ := s.InFlight(); return r > 0 })

	// A request the coordinator marks idle-only (a pace rescale already
	// follows the engine) is deferred, not drained.
	fc.Send(t, &wire.ProbeRequest{RequestID: "r0", CapacityKey: eng.CapacityKey, Reason: wire.ReasonOnDemand, IdleOnly: true})
	for {
		st := fc.Next(t, wire.TypeProbeStatus).ProbeStatus
		if st.State == wire.ProbeRunning {
			continue
		}
		if st.RequestID != "r0" || st.State != wire.ProbeDeferredBusy || !strings.Contains(st.Message, "only while idle") {
			t.Fatalf("idle-only request on a busy engine: status %+v, want deferred_busy", st)
		}
		break
	}

	fc.Send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: eng.CapacityKey, Reason: wire.ReasonOnDemand})
	for {
		st := fc.Next(t, wire.TypeProbeStatus).ProbeStatus
		if st.State == wire.ProbeDraining {
			if st.RequestID != "r1" || st.CapacityKey != eng.CapacityKey {
				t.Fatalf("draining status %+v", st)
			}
			break
		}
		if st.State != wire.ProbeRunning {
			t.Fatalf("status %+v before draining", st)
		}
	}
	cancel() // the request in flight finishes
	m := fc.Next(t, wire.TypeProbeResult).ProbeResult.Measurement
	if !m.Valid() || !m.Drained || m.BusyWaitSeconds <= 0 || m.LoadBefore.Running != 0 {
		t.Fatalf("valid %v drained %v waited %v load %+v; problems %q", m.Valid(), m.Drained, m.BusyWaitSeconds, m.LoadBefore, m.Problems)
	}
}
