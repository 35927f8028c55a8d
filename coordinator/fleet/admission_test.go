package fleet

import (
	"errors"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

func TestUnevenPoolsHoldAndSlightlyUnevenWarn(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("even", "http://1:8000", "m", 24000, 23900), 500)
	h.connect("n2")
	h.put("n2", engine("uneven", "http://2:8000", "m", 24094, 2925))
	h.result("n2", measured("uneven", 500, h.clk.now()))
	h.connect("n3")
	h.put("n3", engine("slight", "http://3:8000", "m", 10000, 7000))
	h.result("n3", measured("slight", 500, h.clk.now()))

	u := h.worker("uneven")
	if u.State != view.StateHeld {
		t.Errorf("uneven: state %s, want held", u.State)
	}
	x, ok := warning(u, wire.CodeDPPoolImbalance)
	if !ok || x.Severity != wire.SeverityCritical {
		t.Fatalf("uneven: warning %+v, ok %v, want critical dp_pool_imbalance", x, ok)
	}
	for _, want := range []string{"rank 0", "24,094", "rank 1", "2,925", "every second request", "Fix:"} {
		if !strings.Contains(x.Message, want) {
			t.Errorf("message lacks %q: %s", want, x.Message)
		}
	}
	if u.PoolRatio == nil || *u.PoolRatio > 0.13 || *u.PoolRatio < 0.12 {
		t.Errorf("pool ratio = %v, want 0.1214", u.PoolRatio)
	}

	s := h.worker("slight")
	if s.State != view.StateAdmitted {
		t.Errorf("0.7 pools: state %s, want admitted", s.State)
	}
	if x, ok := warning(s, wire.CodeDPPoolImbalance); !ok || x.Severity != wire.SeverityWarning {
		t.Errorf("0.7 pools: warning %+v, ok %v, want a warning-level dp_pool_imbalance", x, ok)
	}
	if _, ok := warning(h.worker("even"), wire.CodeDPPoolImbalance); ok {
		t.Error("even pools warned")
	}
	if w := h.weights("m"); len(w) != 2 {
		t.Errorf("weight table = %v, want even and slight only", w)
	}
}

func TestThresholdsAreConfigurable(t *testing.T) {
	cfg := testConfig()
	cfg.Thresholds.PoolHold, cfg.Thresholds.PoolWarn = 0.8, 0.95
	h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m", 10000, 7000))
	h.result("n", measured("k", 500, h.clk.now()))
	if w := h.worker("k"); w.State != view.StateHeld {
		t.Errorf("0.7 pools with pool_hold 0.8: state %s, want held", w.State)
	}
}

func TestAdminAdmitAndHold(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("even", "http://1:8000", "m"), 400)
	h.connect("n2")
	h.put("n2", engine("uneven", "http://2:8000", "m", 24094, 2925))
	h.result("n2", measured("uneven", 400, h.clk.now()))

	if err := h.f.Admit("uneven"); err != nil {
		t.Fatal(err)
	}
	u := h.worker("uneven")
	if u.State != view.StateAdmitted || u.AdminDecision != DecisionAdmit || u.Weight == nil {
		t.Fatalf("after admit: state %s decision %q weight %v", u.State, u.AdminDecision, u.Weight)
	}
	if x, _ := warning(u, wire.CodeDPPoolImbalance); !strings.Contains(x.Message, "admitted it anyway") {
		t.Errorf("the warning should say an admin admitted it: %s", x.Message)
	}
	if h.st.state().Decisions["uneven"] != DecisionAdmit {
		t.Error("admit decision not stored")
	}

	// Hold overrides everything, including a valid even worker.
	if err := h.f.Hold("even"); err != nil {
		t.Fatal(err)
	}
	if e := h.worker("even"); e.State != view.StateHeld || e.Weight != nil {
		t.Errorf("after hold: state %s weight %v", e.State, e.Weight)
	}
	if w := h.weights("m"); len(w) != 1 || w["uneven"] != 1 {
		t.Errorf("weights = %v, want only uneven at 1", w)
	}
	// Decisions survive a restart.
	h2 := h.restart()
	h2.connect("n1")
	h2.snapshot("n1")
	h2.connect("n2")
	h2.snapshot("n2")
	if e, u := h2.worker("even"), h2.worker("uneven"); e.State != view.StateHeld || u.State != view.StateAdmitted {
		t.Errorf("after restart: even %s, uneven %s", e.State, u.State)
	}
	// Admit on a worker the rules would admit clears the hold.
	if err := h2.f.Admit("even"); err != nil {
		t.Fatal(err)
	}
	if e := h2.worker("even"); e.State != view.StateAdmitted || e.AdminDecision != "" {
		t.Errorf("after admit of a held even worker: state %s decision %q", e.State, e.AdminDecision)
	}
	if _, ok := h2.st.state().Decisions["even"]; ok {
		t.Error("the cleared decision is still stored")
	}
	if err := h2.f.Hold("nobody"); err == nil {
		t.Error("Hold of an unknown worker succeeded")
	}
}

func TestAdmitDoesNotOverrideAFailedMeasurement(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m"))
	m := measured("k", 300, h.clk.now())
	m.Failure, m.OutputTokens, m.Problems = wire.CodeProbeFailed, 0, []string{"connection reset"}
	h.result("n", m)
	if err := h.f.Admit("k"); err != nil {
		t.Fatal(err)
	}
	if w := h.worker("k"); w.State != view.StateHeld || w.Weight != nil {
		t.Errorf("state %s weight %v: a worker without a valid measurement has no number to weight", w.State, w.Weight)
	}
}

func TestEngineNotReadyIsPending(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	e := engine("k", "http://1:8000", "m")
	e.Ready, e.Error = false, "dial tcp 127.0.0.1:8000: connection refused"
	acts := h.put("n", e)
	w := h.worker("k")
	if w.State != view.StatePending || len(requests(acts, "")) != 0 {
		t.Fatalf("unreachable engine: state %s, actions %v; want pending and no probe", w.State, acts)
	}
	x, ok := warning(w, wire.CodeEngineUnreachable)
	if !ok || x.Severity != wire.SeverityCritical || !strings.Contains(x.Message, "connection refused") {
		t.Errorf("warning %+v, ok %v", x, ok)
	}
	// Loading (not ready, no error): pending without a warning.
	e.Error = ""
	h.put("n", e)
	if w := h.worker("k"); w.State != view.StatePending || len(w.Warnings) != 0 {
		t.Errorf("loading engine: state %s warnings %v", w.State, w.Warnings)
	}
	// Ready: measured.
	e.Ready = true
	acts = h.put("n", e)
	if r := requests(acts, "k"); len(r) != 1 || r[0].Reason != wire.ReasonRegistration {
		t.Fatalf("ready engine: requests %v, want one registration", r)
	}
	if w := h.worker("k"); w.State != view.StateMeasuring {
		t.Errorf("state %s, want measuring", w.State)
	}
}

func TestKeylessEngines(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	// Never read: a placeholder shows the problem.
	h.engines["n"] = []wire.Engine{{Kind: wire.EngineSGLang, URL: "http://1:30000", Error: "connection refused"}}
	h.snapshot("n")
	ws := h.f.Workers()
	if len(ws) != 1 || ws[0].ID != "unkeyed:n:http://1:30000" || ws[0].State != view.StatePending {
		t.Fatalf("workers = %+v", ws)
	}
	if _, ok := warning(ws[0], wire.CodeEngineUnreachable); !ok {
		t.Error("placeholder lacks engine_unreachable")
	}
	if _, err := h.f.Probe(ws[0].ID); err == nil {
		t.Error("a placeholder was probed")
	}
	if err := h.f.Pin(ws[0].ID, 2); err == nil {
		t.Error("a placeholder was pinned")
	}
	// Readable: the real worker replaces the placeholder.
	h.engines["n"] = nil
	h.admit("n", engine("k", "http://1:30000", "m"), 500)
	if ws := h.f.Workers(); len(ws) != 1 || ws[0].ID != "k" {
		t.Fatalf("workers = %+v, want only k", ws)
	}
	// Unreadable again: the agent cannot key it, so it marks k itself.
	h.engines["n"] = []wire.Engine{{Kind: wire.EngineVLLM, URL: "http://1:30000", Error: "timeout"}}
	h.snapshot("n")
	k := h.worker("k")
	if k.State != view.StatePending || len(h.f.Workers()) != 1 || k.Model != "m" {
		t.Errorf("k after a keyless unreachable report: state %s model %q, %d workers", k.State, k.Model, len(h.f.Workers()))
	}
	if k.Throughput == nil || *k.Throughput != 500 {
		t.Error("k lost its measurement while unreachable")
	}
}

func TestWarningsFromFactsAndSince(t *testing.T) {
	h := newHarness(t)
	e := engine("k", "http://1:8000", "m")
	e.GPUUUIDs = []string{"GPU-1"}
	gpus := []wire.GPU{{Index: 0, UUID: "GPU-1", Processes: []wire.GPUProcess{{PID: 77, Name: "other-team", UsedMemory: 9 << 30, Foreign: true}}},
		{Index: 1, UUID: "GPU-2", Processes: []wire.GPUProcess{{PID: 78, Name: "not-ours", UsedMemory: 9 << 30, Foreign: true}}}}
	h.connect("n")
	snap := func() {
		h.f.Snapshot("n", wire.Snapshot{Node: "n", GPUs: gpus, Engines: []wire.Engine{e}})
	}
	snap()
	m := measured("k", 800, h.clk.now())
	m.SMClockMedianMHz, m.SMClockMinMHz, m.SMClockMaxMHz = 1200, 1100, 1980
	m.ClockEventReasons = []string{"sw_thermal_slowdown"}
	h.result("n", m)

	w := h.worker("k")
	if w.State != view.StateAdmitted {
		t.Fatalf("state %s: warnings from facts must not hold", w.State)
	}
	for _, code := range []string{wire.CodeForeignGPUProcess, wire.CodeGPUClockLow, wire.CodeGPUThrottled} {
		if _, ok := warning(w, code); !ok {
			t.Errorf("missing %s in %+v", code, w.Warnings)
		}
	}
	if x, _ := warning(w, wire.CodeForeignGPUProcess); strings.Contains(x.Message, "not-ours") {
		t.Error("a process on a GPU the engine does not use was reported")
	}
	if len(w.GPUs) != 1 || w.GPUs[0].UUID != "GPU-1" {
		t.Errorf("GPUs = %+v, want only the engine's", w.GPUs)
	}
	first, _ := warning(w, wire.CodeForeignGPUProcess)
	if !first.Since.Equal(t0) {
		t.Errorf("since = %v, want %v", first.Since, t0)
	}

	h.clk.advance(time.Minute)
	snap()
	if x, _ := warning(h.worker("k"), wire.CodeForeignGPUProcess); !x.Since.Equal(t0) {
		t.Errorf("since moved to %v on a later snapshot", x.Since)
	}
	gone := gpus[0].Processes
	gpus[0].Processes = nil
	snap()
	if _, ok := warning(h.worker("k"), wire.CodeForeignGPUProcess); ok {
		t.Error("warning stayed after the process left")
	}
	h.clk.advance(time.Minute)
	gpus[0].Processes = gone
	snap()
	if x, _ := warning(h.worker("k"), wire.CodeForeignGPUProcess); !x.Since.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("since = %v after a break, want %v", x.Since, t0.Add(2*time.Minute))
	}
	// Most severe first.
	e.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 100}, {DPRank: 1, KVTokens: 10}}
	snap()
	if ws := h.worker("k").Warnings; ws[0].Severity != wire.SeverityCritical {
		t.Errorf("warnings not sorted most severe first: %+v", ws)
	}
}

func TestIncompleteButValidMeasurementAdmitsWithWarning(t *testing.T) {
	h := newHarness(t)
	h.connect("mac")
	h.put("mac", engine("k", "http://1:8080", "m"))
	m := measured("k", 60, h.clk.now())
	m.Complete, m.OutputTokens = false, 1900
	h.result("mac", m)
	w := h.worker("k")
	x, ok := warning(w, wire.CodeProbeIncompleteOutput)
	if w.State != view.StateAdmitted || !ok || x.Severity != wire.SeverityWarning {
		t.Errorf("state %s warning %+v ok %v: want admitted with a warning", w.State, x, ok)
	}
}

func TestConfigValidation(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"zero grace":        func(c *Config) { c.OfflineGrace = 0 },
		"negative ttl":      func(c *Config) { c.CacheTTL = -time.Second },
		"min above one":     func(c *Config) { c.WeightMin = 2 },
		"zero min":          func(c *Config) { c.WeightMin = 0 },
		"max below one":     func(c *Config) { c.WeightMax = 0.5 },
		"no history":        func(c *Config) { c.HistoryLen = 0 },
		"hold above warn":   func(c *Config) { c.Thresholds.PoolHold = 0.95 },
		"threshold above 1": func(c *Config) { c.Thresholds.ClockLow = 1.5 },
	} {
		cfg := testConfig()
		mut(&cfg)
		if _, err := New(cfg, newMemStore(), nil, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: New returned %v, want ErrInvalid", name, err)
		}
	}
}
