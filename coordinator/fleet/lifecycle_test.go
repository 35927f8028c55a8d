package fleet

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

func TestRegistrationProbeThenAdmitted(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	acts := h.put("n", engine("k", "http://1:8000", "m"))
	r := requests(acts, "k")
	if len(r) != 1 || r[0].Reason != wire.ReasonRegistration || r[0].RequestID == "" || acts[0].Node != "n" {
		t.Fatalf("actions %+v, want one registration request to n", acts)
	}
	if w := h.worker("k"); w.State != view.StateMeasuring || w.Throughput != nil || w.Weight != nil {
		t.Errorf("before the result: state %s throughput %v weight %v", w.State, w.Throughput, w.Weight)
	}
	// Heartbeats while measuring do not ask again.
	if again := h.snapshot("n"); len(requests(again, "")) != 0 {
		t.Errorf("a heartbeat re-sent the request: %+v", again)
	}
	h.result("n", measured("k", 640, h.clk.now()))
	w := h.worker("k")
	if w.State != view.StateAdmitted || w.Throughput == nil || *w.Throughput != 640 || w.MeasuredAt == nil || len(w.History) != 1 {
		t.Errorf("after the result: %+v", w)
	}
	if h.st.state().Latest["k"].ThroughputTPS != 640 {
		t.Error("measurement not stored")
	}
}

func TestReconnectWithinTTLSendsCachedMeasurement(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.clk.advance(2 * time.Hour)
	h.disconnect("n")
	h.clk.advance(time.Minute) // past the grace: stale, still weighted
	h.f.Tick()
	if w := h.worker("k"); w.State != view.StateStale || w.Weight == nil {
		t.Fatalf("state %s weight %v, want stale with its weight", w.State, w.Weight)
	}
	h.connect("n")
	acts := h.snapshot("n")
	c := cachedMsgs(acts, "k")
	if len(requests(acts, "")) != 0 || len(c) != 1 {
		t.Fatalf("actions %+v, want one cached measurement and no probe", acts)
	}
	if c[0].Measurement.ThroughputTPS != 640 || !c[0].ExpiresAt.Equal(t0.Add(6*time.Hour)) {
		t.Errorf("cached %+v, want 640 expiring at %v", c[0], t0.Add(6*time.Hour))
	}
	if w := h.worker("k"); w.State != view.StateAdmitted || w.Weight == nil {
		t.Errorf("after reconnect: state %s weight %v", w.State, w.Weight)
	}
	// Once per connection, not on every heartbeat.
	if again := h.snapshot("n"); len(again) != 0 {
		t.Errorf("heartbeat actions %+v, want none", again)
	}
}

func TestRestartWithinTTLCostsNoBurst(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m", 1000, 990), 640)
	h.clk.advance(time.Hour)

	h2 := h.restart()
	w := h2.worker("k")
	// Stored workers start as if their agent had just left: still weighted
	// within the grace, from their stored facts.
	if w.State != view.StateAdmitted || w.Throughput == nil || len(w.Ranks) != 2 || w.AgentConnected {
		t.Fatalf("restored worker: %+v", w)
	}
	h2.connect("n")
	acts := h2.snapshot("n")
	if len(requests(acts, "")) != 0 || len(cachedMsgs(acts, "k")) != 1 {
		t.Fatalf("actions after restart %+v, want the cached measurement and no probe", acts)
	}
}

func TestRestoredWorkersGoStaleAfterGraceThenOffline(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h2 := h.restart()
	h2.clk.advance(29 * time.Second)
	h2.f.Tick()
	if w := h2.worker("k"); w.State != view.StateAdmitted {
		t.Fatalf("within grace: %s", w.State)
	}
	h2.clk.advance(time.Second)
	h2.f.Tick()
	w := h2.worker("k")
	x, ok := warning(w, wire.CodeAgentOffline)
	if w.State != view.StateStale || !ok || x.Severity != wire.SeverityWarning || w.Weight == nil || *w.Weight != 1 {
		t.Fatalf("after grace: state %s weight %v warning %+v, want stale at its weight with a warning", w.State, w.Weight, x)
	}
	for _, want := range []string{"node n", "not connected since 2025-03-01T12:00:00Z", "last weight until 2025-03-01T18:00:00Z"} {
		if !strings.Contains(x.Message, want) {
			t.Errorf("stale agent_offline message lacks %q: %s", want, x.Message)
		}
	}
	// The stale weight lasts stale_weight_ttl (the cache TTL, 6 h) from
	// the disconnect, which a restart counts from its start.
	h2.clk.advance(6*time.Hour - 31*time.Second)
	h2.f.Tick()
	if w := h2.worker("k"); w.State != view.StateStale {
		t.Fatalf("a second before the stale TTL: %s", w.State)
	}
	h2.clk.advance(time.Second)
	h2.f.Tick()
	w = h2.worker("k")
	x, ok = warning(w, wire.CodeAgentOffline)
	if w.State != view.StateOffline || !ok || x.Severity != wire.SeverityCritical || w.Weight != nil {
		t.Fatalf("after the stale TTL: state %s weight %v warning %+v", w.State, w.Weight, x)
	}
	for _, want := range []string{"node n", "last heard from 2025-03-01T12:00:00Z", "counted until 2025-03-01T18:00:00Z (stale_weight_ttl 6h0m0s"} {
		if !strings.Contains(x.Message, want) {
			t.Errorf("agent_offline message lacks %q: %s", want, x.Message)
		}
	}
	if _, ok := h2.f.Weights("m"); !ok {
		t.Error("the model of an offline worker is unknown")
	}
	if w := h2.weights("m"); len(w) != 0 {
		t.Errorf("offline worker weighted: %v", w)
	}
}

func TestAfterTTLReconnectAsksForScheduledProbe(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.disconnect("n")
	h.clk.advance(6*time.Hour + time.Minute)
	h.f.Tick()
	h.connect("n")
	acts := h.snapshot("n")
	r := requests(acts, "k")
	if len(r) != 1 || r[0].Reason != wire.ReasonScheduled || len(cachedMsgs(acts, "")) != 0 {
		t.Fatalf("actions %+v, want one scheduled probe and no cached measurement", acts)
	}
	// Meanwhile the old measurement still gives a weight.
	if w := h.worker("k"); w.State != view.StateAdmitted || w.Weight == nil {
		t.Errorf("state %s weight %v while re-measuring", w.State, w.Weight)
	}
}

func TestScheduledRemeasureAndBusyRetry(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.clk.advance(6*time.Hour - time.Second)
	if acts := h.f.Tick(); len(acts) != 0 {
		t.Fatalf("early tick: %+v", acts)
	}
	h.clk.advance(time.Second)
	r := requests(h.f.Tick(), "k")
	if len(r) != 1 || r[0].Reason != wire.ReasonScheduled {
		t.Fatalf("at 6h: %+v, want a scheduled request", r)
	}
	h.f.ProbeStatus("n", wire.ProbeStatus{RequestID: r[0].RequestID, CapacityKey: "k", State: wire.ProbeDeferredBusy})
	w := h.worker("k")
	if w.State != view.StateAdmitted || w.Weight == nil || *w.Throughput != 640 || w.ProbeStatus != wire.ProbeDeferredBusy {
		t.Fatalf("while deferred: %+v", w)
	}
	h.clk.advance(29 * time.Second)
	if acts := h.f.Tick(); len(acts) != 0 {
		t.Fatalf("retry before BusyRetry: %+v", acts)
	}
	h.clk.advance(time.Second)
	r2 := requests(h.f.Tick(), "k")
	if len(r2) != 1 || r2[0].Reason != wire.ReasonScheduled || r2[0].RequestID == r[0].RequestID {
		t.Fatalf("after BusyRetry: %+v", r2)
	}
	// A stale status for the first request changes nothing.
	h.f.ProbeStatus("n", wire.ProbeStatus{RequestID: r[0].RequestID, CapacityKey: "k", State: wire.ProbeDeferredBusy})
	if acts := h.f.Tick(); len(acts) != 0 {
		t.Errorf("stale status re-armed the retry: %+v", acts)
	}
	m := measured("k", 700, h.clk.now())
	m.Trigger = wire.ReasonScheduled
	if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: r2[0].RequestID, Measurement: m}); err != nil {
		t.Fatal(err)
	}
	if w := h.worker("k"); *w.Throughput != 700 || len(w.History) != 2 || w.ProbeStatus != "" {
		t.Errorf("after re-measurement: throughput %v history %d status %q", *w.Throughput, len(w.History), w.ProbeStatus)
	}
}

func TestNewLaunchArgsAreANewWorker(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k-old", "http://1:8000", "m"), 640)
	e := engine("k-new", "http://1:8000", "m")
	e.LaunchArgs = []string{"--max-num-seqs=256"}
	acts := h.put("n", e)
	r := requests(acts, "k-new")
	if len(r) != 1 || r[0].Reason != wire.ReasonRegistration || len(cachedMsgs(acts, "")) != 0 {
		t.Fatalf("actions %+v, want a registration probe for the new key", acts)
	}
	if _, ok := h.f.Worker("k-old"); ok {
		t.Error("the old worker is still listed")
	}
	if w := h.worker("k-new"); w.State != view.StateMeasuring {
		t.Errorf("new worker state %s", w.State)
	}
	// Switching back costs no burst: the old key's measurement is cached.
	acts = h.put("n", engine("k-old", "http://1:8000", "m"))
	if len(requests(acts, "")) != 0 || len(cachedMsgs(acts, "k-old")) != 1 {
		t.Errorf("switching back: %+v, want the cached measurement", acts)
	}
}

func TestInvalidProbeResultsRejected(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("a", "http://1:8000", "m"), 400)
	h.admit("n2", engine("b", "http://2:8000", "m"), 800)
	before := h.weights("m")
	hist := len(h.st.state().History["a"])
	for name, tps := range map[string]float64{"NaN": math.NaN(), "negative": -100, "+Inf": math.Inf(1), "-Inf": math.Inf(-1)} {
		m := measured("a", 400, h.clk.now())
		m.ThroughputTPS = tps
		_, err := h.f.ProbeResult("n", wire.ProbeResult{Measurement: m})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "throughput_tps") {
			t.Errorf("%s throughput: err %v, want ErrInvalid naming throughput_tps", name, err)
		}
	}
	other := measured("a", 5000, h.clk.now())
	other.Model = "another-model"
	bad := map[string]struct {
		node string
		m    wire.Measurement
		want error
	}{
		"other node's worker": {"n2", measured("a", 5000, h.clk.now()), ErrInvalid},
		"unknown key":         {"n", measured("zzz", 5000, h.clk.now()), ErrNotFound},
		"wrong model":         {"n", other, ErrInvalid},
		"empty key":           {"n", measured("", 5000, h.clk.now()), ErrInvalid},
	}
	for name, c := range bad {
		if _, err := h.f.ProbeResult(c.node, wire.ProbeResult{Measurement: c.m}); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
	if after := h.weights("m"); !reflect.DeepEqual(before, after) {
		t.Errorf("weights changed: %v → %v", before, after)
	}
	if n := len(h.st.state().History["a"]); n != hist {
		t.Errorf("rejected results reached the store: history %d → %d", hist, n)
	}
}

func TestFailedMeasurementHoldsAndRetries(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.clk.advance(6 * time.Hour)
	r := requests(h.f.Tick(), "k")
	m := measured("k", 0, h.clk.now())
	m.Failure, m.OutputTokens, m.ExpectedTokens = wire.CodeProbeIncompleteOutput, 1500, 2048
	m.Problems = []string{"usage said 1500, stream had 1500"}
	if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: r[0].RequestID, Measurement: m}); err != nil {
		t.Fatal(err)
	}
	w := h.worker("k")
	x, ok := warning(w, wire.CodeProbeIncompleteOutput)
	if w.State != view.StateHeld || w.Weight != nil || !ok || x.Severity != wire.SeverityCritical || w.Throughput != nil {
		t.Fatalf("after a failed measurement: state %s weight %v warning %+v throughput %v", w.State, w.Weight, x, w.Throughput)
	}
	if len(w.History) != 2 || w.History[1].Valid {
		t.Errorf("history %+v, want the failure recorded as invalid", w.History)
	}
	h.clk.advance(2*time.Minute - time.Second)
	if acts := h.f.Tick(); len(acts) != 0 {
		t.Fatalf("retry before FailRetry: %+v", acts)
	}
	h.clk.advance(time.Second)
	r2 := requests(h.f.Tick(), "k")
	if len(r2) != 1 || r2[0].Reason != wire.ReasonRegistration {
		t.Fatalf("retry: %+v", r2)
	}
	// A restart does not bring the old good number back.
	h2 := h.restart()
	h2.connect("n")
	acts := h2.snapshot("n")
	if len(cachedMsgs(acts, "")) != 0 || len(requests(acts, "k")) != 1 {
		t.Fatalf("after restart: %+v, want a fresh probe, not a cached value", acts)
	}
	if w := h2.worker("k"); w.State != view.StateHeld {
		t.Errorf("after restart: state %s", w.State)
	}
	h2.result("n", measured("k", 900, h2.clk.now()))
	if w := h2.worker("k"); w.State != view.StateAdmitted || *w.Throughput != 900 {
		t.Errorf("after a valid measurement: state %s", w.State)
	}
}

func TestProbeStatusFailedRetries(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	r := requests(h.put("n", engine("k", "http://1:8000", "m")), "k")
	h.f.ProbeStatus("n", wire.ProbeStatus{RequestID: r[0].RequestID, CapacityKey: "k", State: wire.ProbeFailed, Message: "engine returned 500"})
	w := h.worker("k")
	x, ok := warning(w, wire.CodeProbeFailed)
	if !ok || !strings.Contains(x.Message, "engine returned 500") || w.ProbeStatus != wire.ProbeFailed {
		t.Fatalf("warnings %+v status %q", w.Warnings, w.ProbeStatus)
	}
	h.clk.advance(2 * time.Minute)
	if r := requests(h.f.Tick(), "k"); len(r) != 1 || r[0].Reason != wire.ReasonRegistration {
		t.Fatalf("retry: %+v", r)
	}
	h.result("n", measured("k", 500, h.clk.now()))
	if _, ok := warning(h.worker("k"), wire.CodeProbeFailed); ok {
		t.Error("probe_failed stayed after a valid measurement")
	}
}

func TestUnansweredRequestIsResent(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	r := requests(h.put("n", engine("k", "http://1:8000", "m")), "k")
	h.clk.advance(5 * time.Minute)
	h.f.ProbeStatus("n", wire.ProbeStatus{RequestID: r[0].RequestID, CapacityKey: "k", State: wire.ProbeRunning})
	if w := h.worker("k"); w.ProbeStatus != wire.ProbeRunning {
		t.Errorf("status %q", w.ProbeStatus)
	}
	h.clk.advance(5*time.Minute - time.Second)
	if acts := h.f.Tick(); len(acts) != 0 {
		t.Fatalf("re-sent early: %+v", acts)
	}
	h.clk.advance(time.Second)
	r2 := requests(h.f.Tick(), "k")
	if len(r2) != 1 || r2[0].RequestID == r[0].RequestID || r2[0].Reason != wire.ReasonRegistration {
		t.Fatalf("after ProbeTimeout: %+v", r2)
	}
}

func TestOnDemandProbe(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	acts, err := h.f.Probe("k")
	if r := requests(acts, "k"); err != nil || len(r) != 1 || r[0].Reason != wire.ReasonOnDemand {
		t.Fatalf("Probe: %+v %v", acts, err)
	}
	if acts, err := h.f.Probe("k"); err != nil || len(acts) != 0 {
		t.Errorf("second Probe while one is outstanding: %+v %v", acts, err)
	}
	// A busy report for the scheduled cycle does not cancel the weight.
	if w := h.worker("k"); w.State != view.StateAdmitted {
		t.Errorf("state %s while probing on demand", w.State)
	}
	if _, err := h.f.Probe("nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	h.disconnect("n")
	if _, err := h.f.Probe("k"); !errors.Is(err, ErrNotConnected) {
		t.Errorf("disconnected: %v", err)
	}
}

func TestOfflineAfterGraceAndBack(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.admit("n2", engine("k2", "http://2:8000", "m"), 640)
	h.disconnect("n")
	h.clk.advance(29 * time.Second)
	h.f.Tick()
	w := h.worker("k")
	if w.State != view.StateAdmitted || w.AgentConnected {
		t.Fatalf("within grace: state %s connected %v", w.State, w.AgentConnected)
	}
	h.clk.advance(time.Second)
	h.f.Tick()
	w = h.worker("k")
	if w.State != view.StateStale || w.Weight == nil || w.Throughput == nil {
		t.Fatalf("after grace: state %s weight %v throughput %v, want stale with its weight", w.State, w.Weight, w.Throughput)
	}
	if wt := h.weights("m"); len(wt) != 2 || wt["k"] != 1 || wt["k2"] != 1 {
		t.Errorf("weights %v, want k (stale) and k2 at 1", wt)
	}
	// Offline once the stale weight's TTL (6 h from the disconnect) is out.
	h.clk.advance(6*time.Hour - 30*time.Second)
	h.f.Tick()
	w = h.worker("k")
	if w.State != view.StateOffline || w.Weight != nil || w.Throughput == nil {
		t.Fatalf("after the stale TTL: state %s weight %v throughput %v", w.State, w.Weight, w.Throughput)
	}
	if wt := h.weights("m"); len(wt) != 1 || wt["k2"] != 1 {
		t.Errorf("weights %v, want k2 alone at 1", wt)
	}
	if h.worker("k2").State != view.StateAdmitted {
		t.Error("another node's worker went offline")
	}
	// No probes go to an offline worker, however long it is away.
	h.clk.advance(time.Hour)
	if r := requests(h.f.Tick(), "k"); len(r) != 0 {
		t.Errorf("probe to an offline worker: %+v", r)
	}
	// Forgotten after ForgetAfter.
	h.clk.advance(17 * time.Hour)
	h.f.Tick()
	if _, ok := h.f.Worker("k"); ok {
		t.Error("worker not forgotten after a day away")
	}
}

func TestLateDisconnectOfReplacedConnection(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	old := h.conns["n"]
	h.connect("n")  // the server replaced the connection
	h.snapshot("n") // and the agent reported on the new one, as it does at once
	h.f.Disconnect("n", old)
	h.clk.advance(time.Minute)
	h.f.Tick()
	if w := h.worker("k"); !w.AgentConnected || w.State != view.StateAdmitted {
		t.Errorf("a stale Disconnect took the node down: connected %v state %s", w.AgentConnected, w.State)
	}
	if s := h.f.Stats(); s.ConnectedAgents != 1 {
		t.Errorf("connected agents %d", s.ConnectedAgents)
	}
}

// A capacity key belongs to the node that first listed it: another node
// listing it (at its own URL) is refused, its results for it too, and the
// key's measurement stays the owner's. Only once the owner's worker is
// forgotten and its measurement too old to reuse may another node have it,
// and then it is measured afresh.
func TestCapacityKeyStaysWithItsNode(t *testing.T) {
	h := newHarness(t)
	h.admit("a", engine("k", "http://1:8000", "m"), 640)
	h.connect("b")
	acts := h.put("b", engine("k", "http://6:6666", "m"))
	if w := h.worker("k"); w.Node != "a" || w.URL != "http://1:8000" || len(requests(acts, "k")) != 0 {
		t.Fatalf("another node's claim was taken: node %s url %s, requests %v", w.Node, w.URL, requests(acts, "k"))
	}
	if _, err := h.f.ProbeResult("b", wire.ProbeResult{RequestID: h.requestID("k"), Measurement: measured("k", 9000, h.clk.now())}); !errors.Is(err, ErrInvalid) {
		t.Errorf("result from the other node: %v", err)
	}
	if w := h.worker("k"); *w.Throughput != 640 || w.State != view.StateAdmitted {
		t.Errorf("the owner's worker changed: %s %v", w.State, *w.Throughput)
	}
	if st := h.f.Stats(); st.ClaimsRefused != 1 || st.ResultsRefused != 1 {
		t.Errorf("claims refused %d, results refused %d; want 1 and 1", st.ClaimsRefused, st.ResultsRefused)
	}

	// The owner goes away for a day and more: its worker and its key are
	// forgotten, but the key stays a's for KeyTombTTL, over a restart.
	h.disconnect("a")
	h.clk.advance(h.f.cfg.ForgetAfter + h.f.cfg.CacheTTL)
	h.f.Tick()
	if _, ok := h.f.Worker("k"); ok {
		t.Fatal("the owner's worker was not forgotten")
	}
	if _, ok := h.st.state().Latest["k"]; ok {
		t.Error("the old owner's measurement is still stored")
	}
	if tomb := h.st.state().KeyTombs["k"]; tomb.Node != "a" {
		t.Fatalf("stored tomb of k: %+v, want a's", tomb)
	}
	h = h.restart()
	h.connect("b")
	if acts := h.put("b", engine("k", "http://6:6666", "m")); len(requests(acts, "k")) != 0 {
		t.Error("a probe was requested for another node's forgotten key")
	}
	if _, ok := h.f.Worker("k"); ok || h.f.Stats().ClaimsRefused != 1 {
		t.Fatalf("b took a's forgotten key (claims refused %d)", h.f.Stats().ClaimsRefused)
	}

	// The owner comes back and takes its key again at once.
	h.connect("a")
	acts = h.put("a", engine("k", "http://1:8000", "m"))
	if w := h.worker("k"); w.Node != "a" || len(requests(acts, "k")) != 1 {
		t.Fatalf("the owner's return: node %s, requests %d; want a, 1", w.Node, len(requests(acts, "k")))
	}
	if _, ok := h.st.state().KeyTombs["k"]; ok {
		t.Error("the owner took its key back, and its tomb is still stored")
	}

	// Forgotten again, the key is free once KeyTombTTL has passed.
	h.disconnect("a")
	h.clk.advance(h.f.cfg.ForgetAfter + h.f.cfg.CacheTTL)
	h.f.Tick()
	h.put("b", engine("k", "http://6:6666", "m"))
	if _, ok := h.f.Worker("k"); ok {
		t.Fatal("b took a's key within KeyTombTTL of its forgetting")
	}
	h.clk.advance(h.f.cfg.KeyTombTTL)
	h.f.Tick()
	if _, ok := h.st.state().KeyTombs["k"]; ok {
		t.Error("a tomb past KeyTombTTL is still stored")
	}
	acts = h.put("b", engine("k", "http://6:6666", "m"))
	if w := h.worker("k"); w.Node != "b" || w.Measurement != nil || len(requests(acts, "k")) != 1 {
		t.Errorf("after KeyTombTTL: node %s, measurement %v, requests %d; want b, none, 1", w.Node, w.Measurement, len(requests(acts, "k")))
	}
}

// A worker forgotten while the coordinator was down (its record older
// than ForgetAfter at the start) leaves its key its node's all the same,
// though it was never measured.
func TestKeyForgottenAcrossARestartStaysItsNodes(t *testing.T) {
	h := newHarness(t)
	h.connect("a")
	h.put("a", engine("k", "http://1:8000", "m"))
	h.disconnect("a")
	h.clk.advance(h.f.cfg.ForgetAfter + time.Hour)
	h = h.restart()
	if tomb := h.st.state().KeyTombs["k"]; tomb.Node != "a" {
		t.Fatalf("stored tomb of k: %+v, want a's", tomb)
	}
	h.connect("b")
	h.put("b", engine("k", "http://6:6666", "m"))
	if _, ok := h.f.Worker("k"); ok {
		t.Fatal("b took the key of a's worker forgotten across the restart")
	}
	h.connect("a")
	h.put("a", engine("k", "http://1:8000", "m"))
	if w := h.worker("k"); w.Node != "a" {
		t.Errorf("a's return: worker of node %s", w.Node)
	}
}

// An admin who releases a node (fleet.ForgetNode, behind DELETE
// /api/v1/nodes/{name}) releases the keys it owned before they were
// forgotten: another node may list them at once.
func TestReleasedNodeFreesItsForgottenKeys(t *testing.T) {
	h := newHarness(t)
	h.admit("a", engine("k", "http://1:8000", "m"), 640)
	h.disconnect("a")
	h.clk.advance(h.f.cfg.ForgetAfter + h.f.cfg.CacheTTL)
	h.f.Tick()
	h.connect("b")
	h.put("b", engine("k", "http://6:6666", "m"))
	if _, ok := h.f.Worker("k"); ok {
		t.Fatal("b took a's forgotten key")
	}
	if err := h.f.ForgetNode("a"); err != nil {
		t.Fatal(err)
	}
	if n := len(h.st.state().KeyTombs); n != 0 {
		t.Errorf("%d tombs stored after a's release", n)
	}
	if acts := h.put("b", engine("k", "http://6:6666", "m")); len(requests(acts, "k")) != 1 || h.worker("k").Node != "b" {
		t.Errorf("after a's release b's claim: node %s, requests %d", h.worker("k").Node, len(requests(acts, "k")))
	}
}

// Tombs are bounded: MaxKeysPerNode per node, MaxKeyTombs in all, the
// oldest going first.
func TestKeyTombsAreBounded(t *testing.T) {
	cfg := testConfig()
	cfg.MaxKeysPerNode, cfg.MaxKeyTombs = wire.MaxEngines, wire.MaxEngines+2
	h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
	list := func(node string, from, n int) {
		var es []wire.Engine
		for i := from; i < from+n; i++ {
			es = append(es, engine(fmt.Sprintf("%s-%03d", node, i), fmt.Sprintf("http://10.0.0.1:%d", 8000+i), "m"))
		}
		h.engines[node] = es
		h.snapshot(node)
		h.engines[node] = nil
		h.snapshot(node) // no longer listed: unmeasured, the keys are forgotten at the next sweep
		h.clk.advance(2 * sweepEvery)
		h.f.Tick()
	}
	h.connect("a")
	h.connect("b")
	list("a", 0, wire.MaxEngines)
	list("a", wire.MaxEngines, 3)
	tombs := h.st.state().KeyTombs
	if len(tombs) != wire.MaxEngines {
		t.Fatalf("%d tombs of a, want MaxKeysPerNode %d", len(tombs), wire.MaxEngines)
	}
	for i := 0; i < 3; i++ {
		if _, ok := tombs[fmt.Sprintf("a-%03d", i)]; ok {
			t.Errorf("a's oldest tomb a-%03d was kept over a newer one", i)
		}
	}
	list("b", 0, 4)
	tombs = h.st.state().KeyTombs
	if len(tombs) != cfg.MaxKeyTombs || len(h.f.keyTombs) != cfg.MaxKeyTombs {
		t.Fatalf("%d tombs stored, %d held; want MaxKeyTombs %d", len(tombs), len(h.f.keyTombs), cfg.MaxKeyTombs)
	}
	for i := 0; i < 4; i++ {
		if tombs[fmt.Sprintf("b-%03d", i)].Node != "b" {
			t.Errorf("b's newest tomb b-%03d was not kept", i)
		}
	}
	// The index by node holds the same tombs.
	indexed := 0
	for node, keys := range h.f.tombsOf {
		for k := range keys {
			if indexed++; h.f.keyTombs[k].Node != node {
				t.Errorf("tomb %s indexed under %s, owned by %q", k, node, h.f.keyTombs[k].Node)
			}
		}
	}
	if indexed != len(h.f.keyTombs) {
		t.Errorf("%d tombs indexed by node, %d held", indexed, len(h.f.keyTombs))
	}
}

// A keyless engine's placeholder worker is named "unkeyed:" + node + ":" +
// URL, which passes the key grammar but is never claimed: another node
// listing that name as its key is refused like any key of another node's,
// rather than rewriting the placeholder's model and URL as its own.
func TestPlaceholderIDStaysWithItsNode(t *testing.T) {
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", engine("", "http://10.0.0.1:8000", "m"))
	id := "unkeyed:gpu-a:http://10.0.0.1:8000"
	if w := h.worker(id); w.Node != "gpu-a" {
		t.Fatalf("placeholder %+v", w)
	}
	h.connect("evil")
	h.put("evil", engine(id, "http://10.9.9.9:8000", "evil-model"))
	if w := h.worker(id); w.Node != "gpu-a" || w.Model != "m" || w.URL != "http://10.0.0.1:8000" {
		t.Fatalf("another node rewrote the placeholder: node %s model %s url %s", w.Node, w.Model, w.URL)
	}
	if st := h.f.Stats(); st.ClaimsRefused != 1 {
		t.Errorf("claims refused %d, want 1", st.ClaimsRefused)
	}
}

// A probe result is taken only as the answer to a request this fleet sent
// that node for that worker: not without one, not twice, not late.
func TestProbeResultOnlyForARequest(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	acts := h.put("n", engine("k", "http://1:8000", "m"))
	reqs := requests(acts, "k")
	if len(reqs) != 1 {
		t.Fatalf("requests %v", reqs)
	}
	m := measured("k", 640, h.clk.now())
	for _, id := range []string{"", "made-up"} {
		if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: id, Measurement: m}); !errors.Is(err, ErrInvalid) {
			t.Errorf("request id %q: %v", id, err)
		}
	}
	if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: reqs[0].RequestID, Measurement: m}); err != nil {
		t.Fatal(err)
	}
	m2 := measured("k", 9000, h.clk.now())
	if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: reqs[0].RequestID, Measurement: m2}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a second answer to one request: %v", err)
	}
	acts, err := h.f.Probe("k")
	if err != nil {
		t.Fatal(err)
	}
	h.clk.advance(h.f.cfg.ProbeTimeout + time.Second)
	if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: requests(acts, "k")[0].RequestID, Measurement: m2}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an answer past probe_timeout: %v", err)
	}
	if w := h.worker("k"); *w.Throughput != 640 || len(w.History) != 1 {
		t.Errorf("throughput %v, %d measurements; want 640, 1", *w.Throughput, len(w.History))
	}
	if st := h.f.Stats(); st.ResultsRefused != 4 {
		t.Errorf("results refused %d, want 4", st.ResultsRefused)
	}
}

func TestStoreErrorsLeaveFleetConsistent(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m", 24094, 2925)) // held by its pools
	h.result("n", measured("k", 640, h.clk.now()))
	h.admit("n2", engine("k2", "http://2:8000", "m"), 640)
	before := h.f.Workers()
	h.st.setFail(errDisk)

	if err := h.f.Pin("k2", 2); !errors.Is(err, errDisk) {
		t.Errorf("Pin: %v", err)
	}
	if err := h.f.Hold("k2"); !errors.Is(err, errDisk) {
		t.Errorf("Hold: %v", err)
	}
	if err := h.f.Admit("k"); !errors.Is(err, errDisk) {
		t.Errorf("Admit: %v", err)
	}
	h.st.setFail(nil)
	acts, err := h.f.Probe("k2")
	if err != nil {
		t.Fatal(err)
	}
	h.st.setFail(errDisk)
	if _, err := h.f.ProbeResult("n2", wire.ProbeResult{RequestID: requests(acts, "k2")[0].RequestID, Measurement: measured("k2", 5000, h.clk.now())}); !errors.Is(err, errDisk) {
		t.Errorf("ProbeResult: %v", err)
	}
	if after := h.f.Workers(); !reflect.DeepEqual(before, after) {
		t.Errorf("failed writes changed the fleet:\nbefore %+v\nafter  %+v", before, after)
	}
	// Worker records are best effort: a snapshot still applies.
	h.snapshot("n2")

	h.st.setFail(nil)
	if err := h.f.Pin("k2", 2); err != nil {
		t.Fatal(err)
	}
	if w := h.worker("k2"); *w.Weight != 2 {
		t.Errorf("after the store recovered: weight %v", *w.Weight)
	}
}

func TestPinnedWorkerOfflineHasNoWeight(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	if err := h.f.Pin("k", 4); err != nil {
		t.Fatal(err)
	}
	h.disconnect("n")
	h.clk.advance(time.Minute)
	h.f.Tick()
	if w := h.weights("m"); len(w) != 1 || w["k"] != 4 {
		t.Errorf("weights %v: a stale pinned worker keeps its pin", w)
	}
	h.clk.advance(6 * time.Hour)
	h.f.Tick()
	if w := h.weights("m"); len(w) != 0 {
		t.Errorf("weights %v: an offline pinned worker must leave the table", w)
	}
}

func TestSkewedAgentClockIsRestamped(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m"))
	h.result("n", measured("k", 500, h.clk.now().Add(-48*time.Hour)))
	w := h.worker("k")
	if !w.MeasuredAt.Equal(t0) {
		t.Errorf("measured_at %v, want the coordinator's %v", w.MeasuredAt, t0)
	}
	if acts := h.f.Tick(); len(acts) != 0 {
		t.Errorf("an agent two days behind triggered %+v", acts)
	}
}

func TestChangesSubscription(t *testing.T) {
	h := newHarness(t)
	ch, cancel := h.f.Changes()
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m")) // two changes, one wake-up
	select {
	case <-ch:
	default:
		t.Fatal("no notification after a change")
	}
	select {
	case <-ch:
		t.Fatal("notifications were not coalesced")
	default:
	}
	// Nothing due: Tick does not notify.
	h.f.Tick()
	select {
	case <-ch:
		t.Error("an idle Tick notified")
	default:
	}
	cancel()
	cancel() // twice is fine
	if _, open := <-ch; open {
		t.Error("channel still open after unsubscribe")
	}
	h.snapshot("n") // no send on a closed channel
}

func TestStatsAndOrdering(t *testing.T) {
	h := newHarness(t)
	h.admit("z", engine("k3", "http://3:8000", "b-model"), 100)
	h.admit("a", engine("k2", "http://2:8000", "a-model"), 100)
	h.admit("a", engine("k1", "http://9:8000", "a-model"), 100)
	h.connect("q")
	h.put("q", engine("k4", "http://4:8000", "a-model", 100, 10))
	var order []string
	for _, w := range h.f.Workers() {
		order = append(order, w.ID)
	}
	if strings.Join(order, ",") != "k2,k1,k4,k3" {
		t.Errorf("order %v, want by model, node, url", order)
	}
	s := h.f.Stats()
	if s.WorkersByState[view.StateAdmitted] != 3 || s.WorkersByState[view.StateMeasuring] != 1 || s.WorkersByState[view.StateOffline] != 0 {
		t.Errorf("by state %v", s.WorkersByState)
	}
	if s.WarningsByCode[wire.CodeDPPoolImbalance] != 1 || s.ConnectedAgents != 3 || len(s.Workers) != 4 {
		t.Errorf("stats %+v", s)
	}
	if s.Workers[0].ID != "k1" || s.Workers[0].Weight == nil || s.Workers[3].Weight != nil {
		t.Errorf("per-worker stats %+v", s.Workers)
	}
}

func TestRestoreKeepsOneRecordPerEndpoint(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k-old", "http://1:8000", "m"), 640)
	h.clk.advance(time.Minute)
	e := engine("k-new", "http://1:8000", "m")
	e.LaunchArgs = []string{"--max-num-seqs=256"}
	h.put("n", e)
	h.result("n", measured("k-new", 700, h.clk.now()))
	if len(h.st.state().Workers) != 2 {
		t.Fatalf("store holds %d records, want both", len(h.st.state().Workers))
	}
	h2 := h.restart()
	ws := h2.f.Workers()
	if len(ws) != 1 || ws[0].ID != "k-new" {
		t.Fatalf("restored %+v, want only the endpoint's latest worker", ws)
	}
	if w := h2.weights("m"); len(w) != 1 {
		t.Errorf("weights %v: one URL must not be weighted twice", w)
	}
}

func TestNoProbeBeforeTheAgentListsTheWorker(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m")) // registration sent, never answered
	h2 := h.restart()
	h2.connect("n")
	h2.clk.advance(time.Second)
	if acts := h2.f.Tick(); len(acts) != 0 {
		t.Fatalf("probed from stored facts before the first snapshot: %+v", acts)
	}
	if r := requests(h2.snapshot("n"), "k"); len(r) != 1 || r[0].Reason != wire.ReasonRegistration {
		t.Fatalf("after the snapshot: %+v", r)
	}
}

func TestWorkerRecordsAreWrittenOnChange(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m", 100, 100), 640)
	rec := h.st.state().Workers["k"]
	if rec.Node != "n" || rec.URL != "http://1:8000" || len(rec.Ranks) != 2 || !rec.FirstSeen.Equal(t0) {
		t.Fatalf("record %+v", rec)
	}
	writes := h.st.workerWrites
	for range 5 {
		h.clk.advance(10 * time.Second)
		h.snapshot("n")
	}
	if h.st.workerWrites != writes {
		t.Errorf("identical heartbeats wrote the record %d times", h.st.workerWrites-writes)
	}
	h.put("n", engine("k", "http://1:8000", "m", 100, 40))
	if r := h.st.state().Workers["k"]; r.Ranks[1].KVTokens != 40 {
		t.Errorf("changed ranks not written: %+v", r.Ranks)
	}
	h.clk.advance(5 * time.Minute)
	h.snapshot("n")
	if r := h.st.state().Workers["k"]; !r.LastSeen.Equal(h.clk.now()) {
		t.Errorf("last seen %v not refreshed after %v", r.LastSeen, recordEvery)
	}
}

// TestConcurrentUse drives the fleet from two goroutines at once. Its one
// assertion (four weighted workers at the end) is weak by design: its value
// is under -race, which fails it on any unguarded access.
func TestConcurrentUse(t *testing.T) {
	h := newHarness(t)
	h.admit("n0", engine("k0", "http://0:8000", "m"), 500)
	done := make(chan struct{})
	ch, cancel := h.f.Changes()
	defer cancel()
	go func() {
		defer close(done)
		for i := range 200 {
			node := fmt.Sprintf("n%d", i%4)
			h.f.Connect(node, uint64(i), wire.Hello{Node: node})
			h.f.Snapshot(node, wire.Snapshot{Node: node, Engines: []wire.Engine{engine("k"+node, "http://"+node, "m")}})
			_, _ = h.f.ProbeResult(node, wire.ProbeResult{RequestID: h.requestID("k" + node), Measurement: measured("k"+node, float64(100+i), t0)})
			h.f.Tick()
		}
	}()
	for {
		select {
		case <-done:
			if w := h.weights("m"); len(w) != 4 {
				t.Errorf("weights %v", w)
			}
			return
		case <-ch:
			_ = h.f.Workers()
			_, _ = h.f.Weights("m")
			_ = h.f.Stats()
			_ = h.f.Pin("k0", 2)
		}
	}
}
