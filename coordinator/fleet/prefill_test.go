package fleet

import (
	"errors"
	"strings"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

// withPrefill is a valid measurement with a valid prefill part of
// prefill prompt tok/s.
func withPrefill(key string, tps, prefill float64, h *harness) wire.Measurement {
	m := measured(key, tps, h.clk.now())
	m.Prefill = &wire.Prefill{ThroughputTPS: prefill, WarmupTPS: prefill * 0.98, PromptTokens: 32768, ExpectedPromptTokens: 32768,
		WallSeconds: 32768 / prefill, PromptLength: 8192, Requests: 4, Concurrency: 4, TokenSource: "usage", Complete: true}
	return m
}

// admitPrefill brings a worker to admitted with a decode and a prefill
// throughput.
func (h *harness) admitPrefill(node string, e wire.Engine, tps, prefill float64) {
	h.t.Helper()
	h.connectOnce(node)
	h.put(node, e)
	h.result(node, withPrefill(e.CapacityKey, tps, prefill, h))
	if w := h.worker(e.CapacityKey); w.State != view.StateAdmitted {
		h.t.Fatalf("%s: state %s, want admitted; warnings %+v", e.CapacityKey, w.State, w.Warnings)
	}
}

func (h *harness) prefillWeights(model string) map[string]float64 {
	h.t.Helper()
	wt, ok, err := h.f.WeightsOf(model, view.WeightPrefill)
	if !ok || err != nil || wt.Kind != view.WeightPrefill {
		h.t.Fatalf("prefill weights of %q: ok %v err %v kind %q", model, ok, err, wt.Kind)
	}
	out := map[string]float64{}
	for _, e := range wt.Workers {
		out[e.ID] = e.Weight
	}
	return out
}

// The prefill weight is prefill throughput over the model's median prefill
// throughput, apart from the decode weight: the calibrations' fast decoder
// that prefills slowly ranks first by decode and last by prefill.
func TestPrefillWeightRanksApart(t *testing.T) {
	h := newHarness(t)
	h.admitPrefill("h20", engine("h20", "http://1:8000", "m"), 1492.2, 4477.6)
	h.admitPrefill("a100", engine("a100", "http://2:8000", "m"), 1246.5, 6937.6)
	h.admitPrefill("l40s", engine("l40s", "http://3:8000", "m"), 849.6, 12711.8)
	h.admitPrefill("4090", engine("4090", "http://4:8000", "m"), 722.4, 17647.5)
	h.admitPrefill("mac", engine("mac", "http://5:8000", "m"), 319.7, 2483.2)
	d, p := h.weights("m"), h.prefillWeights("m")
	if !near(d["h20"], 1492.2/849.6) || !near(d["4090"], 722.4/849.6) {
		t.Errorf("decode weights %v", d)
	}
	// Median prefill of the five: a100's 6,937.6.
	if !near(p["a100"], 1) || !near(p["4090"], 17647.5/6937.6) || !near(p["h20"], 4477.6/6937.6) {
		t.Errorf("prefill weights %v", p)
	}
	if !(d["h20"] > d["4090"] && p["h20"] < p["4090"]) {
		t.Errorf("the two weights should rank h20 and 4090 apart: decode %v, prefill %v", d, p)
	}
	w := h.worker("4090")
	if w.PrefillTPS == nil || *w.PrefillTPS != 17647.5 || w.PrefillWeight == nil || !near(*w.PrefillWeight, p["4090"]) ||
		w.ComputedPrefillWeight == nil || w.PinnedPrefillWeight != nil {
		t.Errorf("view: prefill tps %v weight %v computed %v pinned %v", w.PrefillTPS, w.PrefillWeight, w.ComputedPrefillWeight, w.PinnedPrefillWeight)
	}
	wt, _, _ := h.f.WeightsOf("m", view.WeightPrefill)
	for _, e := range wt.Workers {
		if e.ID == "4090" && (e.Throughput == nil || *e.Throughput != 17647.5) {
			t.Errorf("prefill table entry %+v: throughput is the prefill throughput", e)
		}
	}
	if dt, _ := h.f.Weights("m"); dt.Kind != view.WeightDecode {
		t.Errorf("decode table kind %q", dt.Kind)
	}
}

// Only admitted workers with a valid prefill part count in the median and
// get a prefill weight; a failed prefill part leaves the decode weight and
// warns.
func TestPrefillWeightNeedsAValidPrefill(t *testing.T) {
	h := newHarness(t)
	h.admitPrefill("n1", engine("a", "http://1:8000", "m"), 1000, 10000)
	h.admitPrefill("n2", engine("b", "http://2:8000", "m"), 1000, 20000)
	h.admit("n3", engine("old", "http://3:8000", "m"), 1000) // an agent without the prefill burst
	bad := withPrefill("cached", 1000, 1e6, h)
	bad.Prefill.Failure, bad.Prefill.ThroughputTPS = wire.PrefillCached, 0
	bad.Prefill.Problems = []string{"the first token of a unique 8192-token prompt came back in 0.014 s"}
	h.connectOnce("n4")
	h.put("n4", engine("cached", "http://4:8000", "m"))
	h.result("n4", bad)
	// A held worker's valid prefill does not count either.
	h.connectOnce("n5")
	h.put("n5", engine("uneven", "http://5:8000", "m", 24094, 2925))
	h.result("n5", withPrefill("uneven", 1000, 1e5, h))

	p := h.prefillWeights("m")
	if len(p) != 2 || !near(p["a"], 10000.0/15000) || !near(p["b"], 20000.0/15000) {
		t.Errorf("prefill weights %v: want a and b only, over their median of 15,000", p)
	}
	if d := h.weights("m"); len(d) != 4 || !near(d["cached"], 1) {
		t.Errorf("decode weights %v: the failed prefill keeps its decode weight", d)
	}
	c := h.worker("cached")
	x, ok := warning(c, wire.CodePrefillFailed)
	if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "cache") || c.State != view.StateAdmitted {
		t.Errorf("cached worker: state %s, warning %+v", c.State, x)
	}
	if c.PrefillWeight != nil || c.PrefillTPS != nil {
		t.Errorf("cached worker has prefill tps %v weight %v", c.PrefillTPS, c.PrefillWeight)
	}
	if w := h.worker("uneven"); w.State != view.StateHeld || w.PrefillWeight != nil {
		t.Errorf("held worker: state %s prefill weight %v", w.State, w.PrefillWeight)
	}
	if w := h.worker("old"); w.PrefillWeight != nil || w.PrefillTPS != nil {
		t.Errorf("a worker without a prefill part: %v %v", w.PrefillTPS, w.PrefillWeight)
	}
	// A later valid prefill (an admin's probe) takes the worker into the table.
	if _, err := h.f.Probe("cached"); err != nil {
		t.Fatal(err)
	}
	h.result("n4", withPrefill("cached", 1000, 15000, h))
	if p := h.prefillWeights("m"); len(p) != 3 || !near(p["cached"], 1) {
		t.Errorf("after a valid prefill: %v", p)
	}
	if _, ok := warning(h.worker("cached"), wire.CodePrefillFailed); ok {
		t.Error("prefill_failed stays after a valid measurement")
	}
}

func TestPrefillWeightClampsWithWarning(t *testing.T) {
	h := newHarness(t)
	h.admitPrefill("n1", engine("crawl", "http://1:8000", "m"), 1000, 100)
	h.admitPrefill("n2", engine("x", "http://2:8000", "m"), 1000, 10000)
	h.admitPrefill("n3", engine("y", "http://3:8000", "m"), 1000, 10000)
	// 20× the decode median is held as implausible until an admin admits
	// it; then both its weights are clamped.
	h.connectOnce("n4")
	h.put("n4", engine("rocket", "http://4:8000", "m"))
	h.result("n4", withPrefill("rocket", 20000, 200000, h))
	if w := h.worker("rocket"); w.State != view.StateHeld || w.PrefillWeight != nil {
		t.Fatalf("an implausible worker: state %s, prefill weight %v", w.State, w.PrefillWeight)
	}
	if err := h.f.Admit("rocket"); err != nil {
		t.Fatal(err)
	}
	p := h.prefillWeights("m")
	if p["crawl"] != 0.25 || p["rocket"] != 8 || p["x"] != 1 {
		t.Fatalf("prefill weights %v, want crawl 0.25 (from 0.01), rocket 8 (from 20), x 1", p)
	}
	low, ok := warning(h.worker("crawl"), wire.CodeWeightClamped)
	if !ok || !strings.HasPrefix(low.Message, "prefill weight: measured 100 prompt tok/s") || !strings.Contains(low.Message, "raised to 0.25") {
		t.Errorf("crawl: %+v", low)
	}
	// Both weights clamped: one warning that says both.
	both, ok := warning(h.worker("rocket"), wire.CodeWeightClamped)
	if !ok || !strings.HasPrefix(both.Message, "decode weight: measured 20000 tok/s") || !strings.Contains(both.Message, "Prefill weight: measured 200000 prompt tok/s") {
		t.Errorf("rocket: %+v", both)
	}
	if _, ok := warning(h.worker("x"), wire.CodeWeightClamped); ok {
		t.Error("an unclamped worker carries weight_clamped")
	}
}

// The prefill pin is the decode pin's twin: it replaces the prefill
// weight alone, is stored apart, survives a restart and is cleared apart.
func TestPrefillPin(t *testing.T) {
	h := newHarness(t)
	h.admitPrefill("n1", engine("a", "http://1:8000", "m"), 1000, 10000)
	h.admitPrefill("n2", engine("b", "http://2:8000", "m"), 500, 30000)
	if err := h.f.PinKind("a", view.WeightPrefill, 3); err != nil {
		t.Fatal(err)
	}
	if err := h.f.Pin("a", 0.5); err != nil {
		t.Fatal(err)
	}
	check := func(h *harness, when string, wantPrefill, wantDecode float64) {
		t.Helper()
		w := h.worker("a")
		if p := h.prefillWeights("m"); p["a"] != wantPrefill {
			t.Errorf("%s: prefill weight %v, want %v", when, p["a"], wantPrefill)
		}
		if d := h.weights("m"); d["a"] != wantDecode {
			t.Errorf("%s: decode weight %v, want %v", when, d["a"], wantDecode)
		}
		if wantPrefill == 3 && (w.PinnedPrefillWeight == nil || *w.PinnedPrefillWeight != 3) {
			t.Errorf("%s: pinned prefill weight %v", when, w.PinnedPrefillWeight)
		}
	}
	check(h, "pinned", 3, 0.5)
	wt, _, _ := h.f.WeightsOf("m", view.WeightPrefill)
	if !wt.Workers[0].Pinned || wt.Workers[1].Pinned {
		t.Errorf("pinned flags %+v", wt.Workers)
	}
	if st := h.st.state(); st.PrefillPins["a"] != 3 || st.Pins["a"] != 0.5 {
		t.Errorf("stored pins %v, prefill %v", st.Pins, st.PrefillPins)
	}
	h2 := h.restart()
	h2.connect("n1")
	h2.snapshot("n1")
	h2.connect("n2")
	h2.snapshot("n2")
	check(h2, "after a restart", 3, 0.5)

	if err := h2.f.UnpinKind("a", view.WeightPrefill); err != nil {
		t.Fatal(err)
	}
	check(h2, "prefill pin cleared", 10000.0/20000, 0.5)
	if st := h2.st.state(); len(st.PrefillPins) != 0 || st.Pins["a"] != 0.5 {
		t.Errorf("stored after clearing: pins %v, prefill %v", st.Pins, st.PrefillPins)
	}
	// Bad input changes nothing.
	for _, err := range []error{
		h2.f.PinKind("a", "speed", 2),
		h2.f.PinKind("a", view.WeightPrefill, -1),
		h2.f.PinKind("nobody", view.WeightPrefill, 2),
		h2.f.UnpinKind("a", "speed"),
	} {
		if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotFound) {
			t.Errorf("err %v, want ErrInvalid or ErrNotFound", err)
		}
	}
	if _, _, err := h2.f.WeightsOf("m", "speed"); !errors.Is(err, ErrInvalid) {
		t.Errorf("WeightsOf an unknown kind: %v", err)
	}
	// A store that cannot write leaves the fleet as it was.
	h2.st.setFail(errDisk)
	if err := h2.f.PinKind("b", view.WeightPrefill, 2); !errors.Is(err, errDisk) {
		t.Errorf("pin with a failing store: %v", err)
	}
	if w := h2.worker("b"); w.PinnedPrefillWeight != nil {
		t.Errorf("a failed write pinned %v", *w.PinnedPrefillWeight)
	}
}

// What a worker can hold is in the view and the weight tables: the smaller
// of its maximum model length and its smallest pool, with a warning when
// the pool is the smaller; and it survives a restart.
func TestMaxContextTokens(t *testing.T) {
	h := newHarness(t)
	e := engine("sg", "http://1:30000", "m", 24094, 24094)
	e.Kind, e.MaxModelLen = wire.EngineSGLang, 40960
	h.admitPrefill("n1", e, 1000, 10000)
	w := h.worker("sg")
	if w.MaxModelLen == nil || *w.MaxModelLen != 40960 || w.MaxContextTokens == nil || *w.MaxContextTokens != 24094 {
		t.Fatalf("max model len %v, max context %v", w.MaxModelLen, w.MaxContextTokens)
	}
	x, ok := warning(w, wire.CodeContextExceedsPool)
	if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "40,960") || !strings.Contains(x.Message, "24,094") {
		t.Errorf("warning %+v", x)
	}
	if w.State != view.StateAdmitted {
		t.Errorf("context_exceeds_pool held the worker: %s", w.State)
	}
	for _, kind := range []string{view.WeightDecode, view.WeightPrefill} {
		wt, _, _ := h.f.WeightsOf("m", kind)
		if len(wt.Workers) != 1 || wt.Workers[0].MaxContextTokens == nil || *wt.Workers[0].MaxContextTokens != 24094 {
			t.Errorf("%s table: %+v", kind, wt.Workers)
		}
	}
	h2 := h.restart()
	if w := h2.worker("sg"); w.MaxContextTokens == nil || *w.MaxContextTokens != 24094 {
		t.Errorf("after a restart, before the agent is back: %v", w.MaxContextTokens)
	}

	// The engine restarted with a context its pool holds: no warning.
	e.MaxModelLen = 16384
	h.put("n1", e)
	w = h.worker("sg")
	if _, ok := warning(w, wire.CodeContextExceedsPool); ok || *w.MaxContextTokens != 16384 {
		t.Errorf("context 16,384: max context %v, warnings %+v", *w.MaxContextTokens, w.Warnings)
	}
	// Nothing known: null.
	h.put("n2", engine("bare", "http://2:8000", "m"))
	if w := h.worker("bare"); w.MaxContextTokens != nil || w.MaxModelLen != nil {
		t.Errorf("unknown context: %v %v", w.MaxContextTokens, w.MaxModelLen)
	}
}
