package probe

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// staleSim is a vLLM sim whose gauges are written when a step ends
// (heft-sim's StaleGaugesOnAbort), with users streaming until leave
// aborts them all at once.
func staleSim(t *testing.T, users int) (s *sim.Server, client *engine.Client, leave func()) {
	cfg := sim.Config{Flavor: sim.FlavorVLLM, SingleTPS: 200, Batch16TPS: 2000, MaxRunning: 64}
	cfg.Faults.StaleGaugesOnAbort = true
	s = startSim(t, cfg)
	client, err := engine.New(engine.Config{Kind: wire.EngineVLLM, URL: s.URL()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	leave = func() { cancel(); wg.Wait() }
	t.Cleanup(leave)
	streamUsers(ctx, &wg, s.URL(), users)
	testutil.Eventually(t, "the users' requests running", 10*time.Second, func() bool {
		l, err := client.Load(t.Context())
		return err == nil && l.Running == users
	})
	return s, client, leave
}

// vLLM keeps its last load on its gauges when every request is aborted at
// once (vllm issues #22545 and #29928). A scheduled probe, which needs an
// idle engine, found them running there for as long as nobody sent the
// engine a request, and deferred every time. With the engine's counters
// standing still beside the load for StaleLoadAfter, the probe takes the
// load for stale and measures.
func TestSimStaleLoadProbed(t *testing.T) {
	t.Parallel()
	s, client, leave := staleSim(t, 6)
	leave()
	testutil.Eventually(t, "the aborted requests to leave the engine", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
	// The gauges keep what the last step before the last abort wrote:
	// all six where they were aborted within one step, fewer where a
	// loaded machine spread the aborts over several.
	stale, err := client.Load(t.Context())
	if err != nil || stale.Running == 0 {
		t.Fatalf("load %+v (%v), want aborted requests still on the gauges", stale, err)
	}
	cfg := Config{URL: s.URL(), Kind: wire.EngineVLLM, Tokens: 64, CapacityKey: "k", Trigger: wire.ReasonScheduled, RequireIdle: true,
		Load: client.Load, Counters: client.Counters,
		ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second, settle: 50 * time.Millisecond,
		busyPoll: 100 * time.Millisecond, staleAfter: time.Second}

	if _, err := Run(t.Context(), cfg); !errors.Is(err, ErrBusy) {
		t.Fatalf("without Stir: %v, want the scheduled probe deferred (the gauges are all it has)", err)
	}

	cfg.Stir = client.Stir
	start := time.Now()
	m := mustRun(t, cfg)
	if !m.Valid() || m.LoadBefore.Running != stale.Running || m.LoadBefore.StaleSeconds < 1 ||
		!strings.Contains(strings.Join(m.Problems, "; "), "stood still for") {
		t.Errorf("valid %v, load before %+v, problems %q", m.Valid(), m.LoadBefore, m.Problems)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("measured after %v, before the load had stood still for 1 s", took)
	}
	if l, err := client.Load(t.Context()); err != nil || l.Running != 0 {
		t.Errorf("after the probe the gauges read %+v (%v), want the probe's own steps to have put them right", l, err)
	}

	// While the probe waits (probe_busy wait), the users leave: it measures
	// once the load they left behind has stood still.
	s, client, leave = staleSim(t, 6)
	cfg.URL, cfg.Load, cfg.Stir, cfg.Trigger, cfg.RequireIdle, cfg.Busy, cfg.BusyWait =
		s.URL(), client.Load, client.Stir, wire.ReasonOnDemand, false, BusyWait, 20*time.Second
	cfg.Counters = client.Counters
	time.AfterFunc(500*time.Millisecond, leave)
	if m := mustRun(t, cfg); !m.Valid() || m.BusyWaitSeconds < 1 {
		t.Errorf("valid %v after waiting %.1f s; problems %q", m.Valid(), m.BusyWaitSeconds, m.Problems)
	}
}

// An engine that is busy moves its counters at every step: a scheduled
// probe defers at once, however long the stale watch would allow.
func TestSimBusyLoadNotStale(t *testing.T) {
	t.Parallel()
	s, client, _ := staleSim(t, 6)
	start := time.Now()
	_, err := Run(t.Context(), Config{URL: s.URL(), Kind: wire.EngineVLLM, Tokens: 64, CapacityKey: "k",
		Trigger: wire.ReasonScheduled, RequireIdle: true, Load: client.Load, Stir: client.Stir,
		ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second, busyPoll: 100 * time.Millisecond, staleAfter: time.Minute})
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Run: %v, want a busy engine's probe deferred", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("deferred after %v; a busy engine's counters move within a step", took)
	}
}

// The rule itself, on a load that never changes: counters that move mean
// a busy engine, counters that stand still a stale load.
func TestStaleLoadNeedsStillCounters(t *testing.T) {
	t.Parallel()
	s := startSim(t, sim.Config{Flavor: sim.FlavorVLLM, SingleTPS: 200, Batch16TPS: 2000})
	busy := wire.Load{Known: true, Running: 3, KVUsage: 0.2}
	var moving float64
	for _, tc := range []struct {
		name string
		stir func(context.Context) (float64, error)
		want error
	}{
		{"counters moving", func(context.Context) (float64, error) { moving++; return moving, nil }, ErrBusy},
		{"counters still", func(context.Context) (float64, error) { return 42, nil }, nil},
		{"counters unreadable", func(context.Context) (float64, error) { return 0, errors.New("no /metrics") }, ErrBusy},
	} {
		_, err := Run(t.Context(), Config{URL: s.URL(), Kind: wire.EngineVLLM, Tokens: 16, CapacityKey: "k",
			Trigger: wire.ReasonScheduled, RequireIdle: true, Stir: tc.stir,
			Load:         func(context.Context) (wire.Load, error) { return busy, nil },
			ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second, busyPoll: 20 * time.Millisecond, staleAfter: 200 * time.Millisecond})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Run: %v, want %v", tc.name, err, tc.want)
		}
	}
}
