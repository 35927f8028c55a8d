package fleet

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/view"
	"heft/shared/wire"
)

// offerTo connects node with a hello that offers ms, then sends what the
// node lists.
func (h *harness) offerTo(node string, ms ...wire.CachedMeasurement) []Action {
	h.seq++
	h.conns[node] = h.seq
	h.f.Connect(node, h.seq, wire.Hello{Node: node, AgentVersion: "test", Measurements: ms})
	return h.snapshot(node)
}

// held is what a coordinator handed an agent for m.
func held(m wire.Measurement, ttl time.Duration) wire.CachedMeasurement {
	m.Node = "n1"
	return wire.CachedMeasurement{Measurement: m, ExpiresAt: m.FinishedAt.Add(ttl)}
}

// A coordinator on an empty state takes the measurement the agent held
// from the last one: the worker is admitted at it, no burst is asked, and
// the measurement is stored like a fresh result.
func TestOfferTakenOnEmptyState(t *testing.T) {
	h := newHarness(t)
	h.engines["n1"] = []wire.Engine{engine("k1", "http://a:8000", "m")}
	h.engines["n2"] = []wire.Engine{engine("k2", "http://b:8000", "m")}
	ttl := h.f.cfg.CacheTTL
	acts := h.offerTo("n1", held(measured("k1", 2000, t0.Add(-time.Hour)), ttl))
	if r := requests(acts, ""); len(r) != 0 {
		t.Fatalf("probe requested despite the offer: %+v", r[0])
	}
	if w := h.worker("k1"); w.State != view.StateAdmitted || w.Measurement == nil || w.Measurement.ThroughputTPS != 2000 {
		t.Fatalf("worker %s, measurement %+v; want admitted at 2000", w.State, w.Measurement)
	}
	if c := cachedMsgs(acts, "k1"); len(c) != 1 {
		t.Errorf("the agent was not handed the taken measurement back: %d messages", len(c))
	}
	if got := h.st.state().Latest["k1"]; got.ThroughputTPS != 2000 || !got.FinishedAt.Equal(t0.Add(-time.Hour)) {
		t.Errorf("stored %v at %s; want 2000 at its own time, not re-stamped", got.ThroughputTPS, got.FinishedAt)
	}
	if st := h.f.Stats(); st.HandedOver[OfferTaken] != 1 || st.ProbeRequests[wire.ReasonRegistration] != 0 {
		t.Errorf("handed over %v, registration probes %d", st.HandedOver, st.ProbeRequests[wire.ReasonRegistration])
	}
	// The second node offers nothing: it is measured as before.
	if r := requests(h.offerTo("n2"), "k2"); len(r) != 1 || r[0].Reason != wire.ReasonRegistration {
		t.Fatalf("a node without an offer: %+v, want one registration probe", r)
	}
	// An offer is taken once: it cannot replace the fleet's own fresh one.
	later := measured("k1", 9000, t0)
	if r := requests(h.offerTo("n1", held(later, ttl)), "k1"); len(r) != 0 {
		t.Fatalf("probe requested for a measured worker: %+v", r)
	}
	if w := h.worker("k1"); w.Measurement.ThroughputTPS != 2000 {
		t.Errorf("a reconnect's offer replaced the fleet's own measurement: %v", w.Measurement.ThroughputTPS)
	}
}

// Every offer the fleet cannot trust is refused with its reason, and the
// worker is measured instead.
func TestOfferRefusedFallsBackToProbe(t *testing.T) {
	ttl := DefaultConfig().CacheTTL
	good := measured("k1", 2000, t0.Add(-time.Hour))
	cases := []struct {
		name string
		edit func(*wire.CachedMeasurement)
		why  string
	}{
		{"expired by the cache_ttl", func(o *wire.CachedMeasurement) {
			o.Measurement.FinishedAt = t0.Add(-ttl - time.Minute)
			o.ExpiresAt = t0.Add(time.Hour)
		}, "expired: measured"},
		{"past its expiry", func(o *wire.CachedMeasurement) { o.ExpiresAt = t0.Add(-time.Second) }, "expired at"},
		{"no expiry", func(o *wire.CachedMeasurement) { o.ExpiresAt = time.Time{} }, "no finish time or no expiry"},
		{"from the future", func(o *wire.CachedMeasurement) { o.Measurement.FinishedAt = t0.Add(2 * time.Hour) }, "after the coordinator's clock"},
		{"failed", func(o *wire.CachedMeasurement) {
			o.Measurement.Failure, o.Measurement.ThroughputTPS = wire.CodeProbeFailed, 0
		}, "not a valid measurement"},
		{"NaN", func(o *wire.CachedMeasurement) { o.Measurement.ThroughputTPS = math.NaN() }, "not a finite number"},
		{"negative", func(o *wire.CachedMeasurement) { o.Measurement.OutputTokens = -1 }, "negative counts"},
		{"another model", func(o *wire.CachedMeasurement) { o.Measurement.Model = "other" }, `measured model`},
		{"another engine kind", func(o *wire.CachedMeasurement) { o.Measurement.EngineKind = wire.EngineSGLang }, "sglang engine"},
		{"another node", func(o *wire.CachedMeasurement) { o.Measurement.Node = "n9" }, `measured for node`},
		{"other launch arguments", func(o *wire.CachedMeasurement) { o.Measurement.CapacityKey = "k1-other-args" }, "lists no engine with this capacity key"},
		{"judged implausible", func(o *wire.CachedMeasurement) { o.Measurement.Implausible = "too fast" }, "judged implausible"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			var logs strings.Builder
			h.f.log = hclog.New(&hclog.LoggerOptions{Output: &logs})
			e := engine("k1", "http://a:8000", "m")
			h.engines["n1"] = []wire.Engine{e}
			o := held(good, ttl)
			c.edit(&o)
			acts := h.offerTo("n1", o)
			if r := requests(acts, "k1"); len(r) != 1 || r[0].Reason != wire.ReasonRegistration {
				t.Fatalf("requests %+v, want one registration probe", r)
			}
			if w := h.worker("k1"); w.State != view.StateMeasuring || w.Measurement != nil {
				t.Errorf("worker %s with measurement %+v; want measuring with none", w.State, w.Measurement)
			}
			if st := h.f.Stats(); st.HandedOver[OfferRefused] != 1 || st.HandedOver[OfferTaken] != 0 {
				t.Errorf("handed over %v", st.HandedOver)
			}
			if !strings.Contains(logs.String(), "refusing the measurement the agent offered") || !strings.Contains(logs.String(), c.why) {
				t.Errorf("log %q; want the refusal with %q", logs.String(), c.why)
			}
		})
	}
}

// An offer older than a measurement the fleet holds, even a failed one,
// is refused: reconnecting cannot undo a newer failure.
func TestOfferOlderThanOwnFailureRefused(t *testing.T) {
	h := newHarness(t)
	e := engine("k1", "http://a:8000", "m")
	h.connect("n1")
	h.put("n1", e)
	bad := measured("k1", 0, t0)
	bad.Failure = wire.CodeProbeFailed
	h.result("n1", bad)
	h.clk.advance(time.Minute)
	h.offerTo("n1", held(measured("k1", 2000, t0.Add(-time.Hour)), time.Hour*6))
	if w := h.worker("k1"); w.State != view.StateHeld {
		t.Fatalf("state %s, want held on its own failed measurement", w.State)
	}
	if st := h.f.Stats(); st.HandedOver[OfferRefused] != 1 {
		t.Errorf("handed over %v, want one refused", st.HandedOver)
	}
}

// An offered measurement is judged for plausibility by this fleet's
// limits, as a fresh result is: one beyond them is held.
func TestOfferJudgedForPlausibility(t *testing.T) {
	h := newHarness(t)
	h.engines["n1"] = []wire.Engine{engine("k1", "http://a:8000", "m")}
	h.offerTo("n1", held(measured("k1", 2e6, t0.Add(-time.Minute)), time.Hour))
	w := h.worker("k1")
	if _, ok := warning(w, wire.CodeImplausibleMeasurement); w.State != view.StateHeld || !ok {
		t.Fatalf("state %s, warnings %+v; want held as implausible", w.State, w.Warnings)
	}
}

// A probe deferred as busy again and again is asked for less and less
// often, and the worker says so.
func TestBusyDeferralsBackOff(t *testing.T) {
	h := newHarness(t)
	e := engine("k1", "http://a:8000", "m")
	h.connect("n1")
	h.put("n1", e)
	retry := h.f.cfg.BusyRetry
	var waits []time.Duration
	for range 6 {
		id := h.requestID("k1")
		h.f.ProbeStatus("n1", wire.ProbeStatus{RequestID: id, CapacityKey: "k1", State: wire.ProbeDeferredBusy, Message: "other traffic shared the engine"})
		w := h.worker("k1")
		x, ok := warning(w, wire.CodeProbeDeferred)
		if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "other traffic shared the engine") {
			t.Fatalf("warnings %+v; want probe_deferred naming the last message", w.Warnings)
		}
		var waited time.Duration
		for waited = 0; ; waited += time.Second {
			if len(requests(h.f.Tick(), "k1")) > 0 {
				break
			}
			h.clk.advance(time.Second)
			if waited > time.Hour {
				t.Fatal("never asked again")
			}
		}
		waits = append(waits, waited)
	}
	want := []time.Duration{retry, 2 * retry, 4 * retry, 8 * retry, 16 * retry, 16 * retry}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	h.result("n1", measured("k1", 1000, h.clk.now()))
	if w := h.worker("k1"); w.State != view.StateAdmitted {
		t.Fatalf("state %s", w.State)
	} else if _, ok := warning(w, wire.CodeProbeDeferred); ok {
		t.Errorf("probe_deferred kept after a valid measurement")
	}
}
