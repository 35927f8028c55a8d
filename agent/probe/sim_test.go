package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"heft/shared/memnet"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// startSim runs a simulated engine on 127.0.0.1 for one test.
func startSim(t testing.TB, cfg sim.Config) *sim.Server {
	t.Helper()
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start sim: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// bubbleSim serves a simulated engine on an in-memory listener, for a
// test inside a testing/synctest bubble: the sim's steps, the probe's
// clock and the HTTP between them all run on the bubble's clock, so what
// the probe measures is the sim's model, exactly, however busy the
// machine. The client dials the sim; the test's cleanup closes both.
func bubbleSim(t *testing.T, cfg sim.Config) (*sim.Server, *http.Client) {
	t.Helper()
	ln := memnet.Listen(8000)
	s, err := sim.Serve(cfg, ln)
	if err != nil {
		t.Fatalf("serve sim: %v", err)
	}
	client := ln.Client()
	t.Cleanup(func() {
		client.CloseIdleConnections()
		s.Close()
	})
	return s, client
}

// simLoad reports the sim's load as an engine client would from /metrics.
func simLoad(s *sim.Server) func(context.Context) (wire.Load, error) {
	return func(context.Context) (wire.Load, error) {
		r, w := s.InFlight()
		return wire.Load{Known: true, Running: r, Waiting: w}, nil
	}
}

func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

// exact says whether a figure measured in a bubble is the model's: the
// same to the nanoseconds of the clock.
func exact(got, want float64) bool { return math.Abs(got-want) <= 1e-6*want }

// capacity is the model's decode capacity of cfg for c requests of n
// output tokens (prompts cost nothing without a prefill rate).
func capacity(t *testing.T, cfg sim.Config, c, n int) float64 {
	t.Helper()
	want, err := cfg.DecodeCapacity(c, 1, n)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// simBubble runs body in a testing/synctest bubble (see bubbleSim).
func simBubble(t *testing.T, body func(t *testing.T)) {
	t.Parallel()
	synctest.Test(t, body)
}

// The probe measures a sim at its calibration: 16 requests together, each
// decoding at a sixteenth of it. With speculative decoding each decode step
// gives a request several tokens in one streamed chunk (vLLM with a
// speculative config, SGLang with EAGLE or MTP), so a stream carries fewer
// chunks than its usage says. That is not a short answer: the probe counts
// the tokens by usage and measures the engine, and a request's decode rate
// is its tokens after the first, not its chunks, over the time between its
// first and last.
func TestSimThroughputIsCapacityAt16(t *testing.T) {
	for _, tc := range []struct {
		kind   string
		accept int
	}{{wire.EngineVLLM, 0}, {wire.EngineVLLM, 3}, {wire.EngineSGLang, 3}} {
		t.Run(fmt.Sprintf("%s/spec-accept=%d", tc.kind, tc.accept), func(t *testing.T) {
			simBubble(t, func(t *testing.T) {
				cfg := sim.Config{Flavor: tc.kind, SingleTPS: 200, Batch16TPS: 2000, SpecAccept: tc.accept}
				s, client := bubbleSim(t, cfg)
				m := mustRun(t, Config{URL: s.URL(), HTTPClient: client, Kind: tc.kind, CapacityKey: "test/" + tc.kind,
					ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second})
				if !m.Valid() || !m.Complete {
					t.Fatalf("failure %q problems %q", m.Failure, m.Problems)
				}
				if m.OutputTokens != 2048 || m.Requests != 16 {
					t.Errorf("tokens %d requests %d", m.OutputTokens, m.Requests)
				}
				want := capacity(t, cfg, 16, 128)
				if !exact(m.ThroughputTPS, want) || !exact(want, 2000) {
					t.Errorf("throughput %v tok/s, want the sim's %v (2000)", m.ThroughputTPS, want)
				}
				if !exact(m.DecodeTPSP50, want/16) {
					t.Errorf("decode p50 %v tok/s, want %v: tokens, not chunks, per second", m.DecodeTPSP50, want/16)
				}
			})
		})
	}
}

func TestSimColdEngineWarmsUp(t *testing.T) {
	simBubble(t, func(t *testing.T) {
		// PRODUCT.md story 3: probed the moment it starts, a cold engine
		// must still give its warm capacity. The cold warm-up burst lasts
		// longer than the cold period, so the measured burst is warm.
		const factor = 3.6
		cfg := sim.Config{SingleTPS: 150, Batch16TPS: 1200, ColdFactor: factor, ColdSeconds: 5}
		s, client := bubbleSim(t, cfg)
		m := mustRun(t, Config{URL: s.URL(), HTTPClient: client, Kind: wire.EngineVLLM, CapacityKey: "test/vllm",
			ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second})
		if !m.Valid() {
			t.Fatalf("failure %q problems %q", m.Failure, m.Problems)
		}
		if want := capacity(t, cfg, 16, 128); !exact(m.ThroughputTPS, want) {
			t.Errorf("throughput %v tok/s, want the warm %v", m.ThroughputTPS, want)
		}
		// The warm-up ran cold for all but its last few steps: its ratio to
		// the measured burst approaches the cold factor, never beyond it.
		r := m.ThroughputTPS / m.WarmupTPS
		t.Logf("warm-up %.2f tok/s, measured %.2f: ratio %.4f", m.WarmupTPS, m.ThroughputTPS, r)
		if r < 2.5 || r > factor {
			t.Errorf("cold ratio %.3f (warm-up %.2f tok/s), want between 2.5 and %v", r, m.WarmupTPS, factor)
		}
	})
}

func TestSimTwoSpeedsGiveTheirRatio(t *testing.T) {
	simBubble(t, func(t *testing.T) {
		fastCfg, slowCfg := sim.Config{SingleTPS: 300, Batch16TPS: 2400}, sim.Config{SingleTPS: 150, Batch16TPS: 1200}
		run := func(cfg sim.Config) float64 {
			s, client := bubbleSim(t, cfg)
			m := mustRun(t, Config{URL: s.URL(), HTTPClient: client, Kind: wire.EngineVLLM, CapacityKey: "k", ReadyTimeout: 10 * time.Second})
			if !m.Valid() {
				t.Fatalf("failure %q problems %q", m.Failure, m.Problems)
			}
			return m.ThroughputTPS
		}
		fast, slow := run(fastCfg), run(slowCfg)
		if r := fast / slow; !exact(r, 2) {
			t.Errorf("ratio %v (%v / %v tok/s), want 2", r, fast, slow)
		}
	})
}

func TestSimFlavors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		flavor, kind string
		complete     bool
	}{
		{sim.FlavorVLLM, wire.EngineVLLM, true},
		{sim.FlavorSGLang, wire.EngineSGLang, true},
		{sim.FlavorLlamaCpp, wire.EngineLlamaCpp, true},
		{sim.FlavorVLLM, "", true}, // unknown kind: the union of fields works
		{sim.FlavorMLX, wire.EngineMLX, false},
		{sim.FlavorOllama, wire.EngineOllama, false},
	}
	for _, tt := range tests {
		t.Run(tt.flavor+"/kind="+tt.kind, func(t *testing.T) {
			s := startSim(t, sim.Config{Flavor: tt.flavor, SingleTPS: 1000, Batch16TPS: 8000, Seed: 7})
			m := mustRun(t, Config{URL: s.URL(), Kind: tt.kind, Concurrency: 4, Tokens: 64, CapacityKey: "k", ReadyTimeout: 10 * time.Second})
			if !m.Valid() || m.Complete != tt.complete {
				t.Fatalf("valid %v complete %v (want %v); failure %q problems %q", m.Valid(), m.Complete, tt.complete, m.Failure, m.Problems)
			}
			if tt.complete && m.OutputTokens != 256 {
				t.Errorf("tokens %d, want 256", m.OutputTokens)
			}
			if m.Model != sim.DefaultModel {
				t.Errorf("model %q", m.Model)
			}
		})
	}
}

func TestSimFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		faults  sim.Faults
		failure string
	}{
		{"ignores min_tokens", sim.Faults{IgnoreMinTokens: true}, wire.CodeProbeIncompleteOutput},
		{"usage lies", sim.Faults{UsageExtra: 2}, wire.CodeProbeIncompleteOutput},
		{"fails every 5th", sim.Faults{FailEvery: 5}, wire.CodeProbeFailed},
		{"drops streams", sim.Faults{DropStreamAfter: 10}, wire.CodeProbeFailed},
		{"malformed sse", sim.Faults{MalformedSSE: true}, wire.CodeProbeFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startSim(t, sim.Config{SingleTPS: 1000, Batch16TPS: 8000, Seed: 1, Faults: tt.faults})
			// 300 tokens: a natural length almost never reaches it.
			m := mustRun(t, Config{URL: s.URL(), Kind: wire.EngineVLLM, Concurrency: 4, Tokens: 300, CapacityKey: "k",
				ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second})
			if m.Failure != tt.failure || m.Valid() || m.ThroughputTPS != 0 {
				t.Fatalf("failure %q (want %q) valid %v tps %v; problems %q", m.Failure, tt.failure, m.Valid(), m.ThroughputTPS, m.Problems)
			}
		})
	}
}

// In a bubble the sim's 300 ms of not being ready pass on the bubble's
// clock: however slowly a busy machine starts the probe, it finds the sim
// not ready.
func TestSimNotReadyAtFirst(t *testing.T) {
	simBubble(t, func(t *testing.T) {
		s, client := bubbleSim(t, sim.Config{SingleTPS: 1000, Batch16TPS: 8000, Faults: sim.Faults{NotReadyFor: 300 * time.Millisecond}})
		var waited bool
		m := mustRun(t, Config{URL: s.URL(), HTTPClient: client, Kind: wire.EngineVLLM, Tokens: 16, CapacityKey: "k", ReadyTimeout: 10 * time.Second,
			Progress: func(p Progress) { waited = waited || (p.Phase == PhaseWaitingReady && p.Elapsed > 0) }})
		if !m.Valid() || !waited {
			t.Fatalf("valid %v waited %v; failure %q problems %q", m.Valid(), waited, m.Failure, m.Problems)
		}
	})
}

func TestSimBusyDefersScheduledProbe(t *testing.T) {
	t.Parallel()
	s := startSim(t, sim.Config{SingleTPS: 300, Batch16TPS: 3000})

	// Someone else's long request keeps the engine busy.
	ctx, cancel := context.WithCancel(t.Context())
	body := []byte(`{"model":"` + sim.DefaultModel + `","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body) // until cancel
			resp.Body.Close()
		}
	}()
	testutil.Eventually(t, "the long request to run", 10*time.Second, func() bool { r, _ := s.InFlight(); return r > 0 })

	cfg := Config{URL: s.URL(), Kind: wire.EngineVLLM, Tokens: 16, CapacityKey: "k", Trigger: wire.ReasonScheduled,
		RequireIdle: true, Load: simLoad(s), ReadyTimeout: 10 * time.Second}
	m, err := Run(t.Context(), cfg)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("err = %v, want ErrBusy (measurement %+v)", err, m)
	}

	// On demand, it waits for the engine, and gives up rather than
	// measure the share a busy engine would give it.
	od := cfg
	od.RequireIdle, od.Trigger, od.BusyWait, od.busyPoll = false, wire.ReasonOnDemand, 300*time.Millisecond, 50*time.Millisecond
	if m, err = Run(t.Context(), od); !errors.Is(err, ErrBusy) || m.Valid() {
		t.Fatalf("on-demand: err = %v, valid %v", err, m.Valid())
	}

	// Once the engine is idle, the scheduled probe goes ahead.
	cancel()
	testutil.Eventually(t, "the engine to be idle", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
	m = mustRun(t, cfg)
	if !m.Valid() || m.Busy {
		t.Fatalf("idle: valid %v busy %v problems %q", m.Valid(), m.Busy, m.Problems)
	}
}

// BenchmarkProbeOverhead measures what a probe costs beyond its two bursts:
// its wall time against the ideal 2 × (2048 tokens / true tok/s).
func BenchmarkProbeOverhead(b *testing.B) {
	const s16 = 3000.0
	s := startSim(b, sim.Config{SingleTPS: 300, Batch16TPS: s16})
	ideal := 2 * (2048 / s16)
	var total, tps float64
	for b.Loop() {
		start := time.Now()
		m, err := Run(b.Context(), Config{URL: s.URL(), Kind: wire.EngineVLLM, CapacityKey: "bench"})
		if err != nil || !m.Valid() {
			b.Fatalf("err %v failure %q problems %q", err, m.Failure, m.Problems)
		}
		total += time.Since(start).Seconds()
		tps += m.ThroughputTPS
	}
	b.ReportMetric(total/float64(b.N)/ideal, "wall/ideal")
	b.ReportMetric(tps/float64(b.N), "tok/s")
}
