package fleet

import (
	"errors"
	"math"
	"strings"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

func TestTwoWorkersWeighInRatioOfThroughput(t *testing.T) {
	h := newHarness(t)
	h.admit("gpu-a", engine("a", "http://a:8000", "qwen"), 992)
	h.admit("gpu-b", engine("b", "http://b:8000", "qwen"), 453)
	w := h.weights("qwen")
	// Median of two is their mean, 722.5: the story's 1.37 and 0.63.
	if !near(w["a"], 992/722.5) || !near(w["b"], 453/722.5) {
		t.Errorf("weights = %v, want a=%.4f b=%.4f", w, 992/722.5, 453/722.5)
	}
	if !near(w["a"]/w["b"], 992.0/453.0) {
		t.Errorf("ratio %v, want %v", w["a"]/w["b"], 992.0/453.0)
	}
	for _, id := range []string{"a", "b"} {
		if _, ok := warning(h.worker(id), wire.CodeWeightClamped); ok {
			t.Errorf("%s: unexpected weight_clamped", id)
		}
	}
}

func TestThreeWorkersUseMedian(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("slow", "http://1:8000", "m"), 100)
	h.admit("n2", engine("mid", "http://2:8000", "m"), 200)
	h.admit("n3", engine("fast", "http://3:8000", "m"), 700)
	w := h.weights("m")
	if !near(w["slow"], 0.5) || !near(w["mid"], 1) || !near(w["fast"], 3.5) {
		t.Errorf("weights = %v, want slow 0.5, mid 1 (the median itself), fast 3.5", w)
	}
	// Recomputing the whole fleet's weights (or re-deriving everything, as a
	// restart does) changes nothing that is already right.
	h.f.RecomputeWeights()
	h.f.Reevaluate()
	if again := h.weights("m"); !near(again["slow"], 0.5) || !near(again["mid"], 1) || !near(again["fast"], 3.5) {
		t.Errorf("after a full recompute: %v", again)
	}
	// Another model's workers do not count in this model's median.
	h.admit("n4", engine("other", "http://4:8000", "m2"), 10000)
	if w2 := h.weights("m"); !near(w2["mid"], 1) {
		t.Errorf("a worker of another model moved the median: %v", w2)
	}
	if w2 := h.weights("m2"); !near(w2["other"], 1) {
		t.Errorf("a lone worker's weight = %v, want 1", w2)
	}
}

func TestClampBothWaysWithWarning(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("crawl", "http://1:8000", "m"), 10)
	h.admit("n2", engine("x", "http://2:8000", "m"), 1000)
	h.admit("n3", engine("y", "http://3:8000", "m"), 1000)
	// Twenty times the median is held as implausible until an admin
	// admits it; then the clamp keeps its weight within range.
	h.connect("n4")
	h.put("n4", engine("rocket", "http://4:8000", "m"))
	h.result("n4", measured("rocket", 20000, h.clk.now()))
	if w := h.worker("rocket"); w.State != view.StateHeld || w.Weight != nil {
		t.Fatalf("rocket: %s weight %v, want held without a weight", w.State, w.Weight)
	}
	if err := h.f.Admit("rocket"); err != nil {
		t.Fatal(err)
	}
	if x, ok := warning(h.worker("rocket"), wire.CodeImplausibleMeasurement); !ok || x.Severity != wire.SeverityWarning ||
		!strings.Contains(x.Message, "admitted it anyway") {
		t.Errorf("rocket after admit: %+v", x)
	}
	w := h.weights("m")
	if w["crawl"] != 0.25 || w["rocket"] != 8 || w["x"] != 1 {
		t.Fatalf("weights = %v, want crawl 0.25 (from 0.01), rocket 8 (from 20), x 1", w)
	}
	low, ok := warning(h.worker("crawl"), wire.CodeWeightClamped)
	if !ok || low.Severity != wire.SeverityWarning || !strings.Contains(low.Message, "raised to 0.25") || !strings.Contains(low.Message, "0.01") {
		t.Errorf("crawl warning = %+v, ok %v", low, ok)
	}
	high, ok := warning(h.worker("rocket"), wire.CodeWeightClamped)
	if !ok || !strings.Contains(high.Message, "lowered to 8") || !strings.Contains(high.Message, "median of 1000") {
		t.Errorf("rocket warning = %+v, ok %v", high, ok)
	}
	if _, ok := warning(h.worker("x"), wire.CodeWeightClamped); ok {
		t.Error("an unclamped worker carries weight_clamped")
	}
	if cw := h.worker("rocket").ComputedWeight; cw == nil || *cw != 8 {
		t.Errorf("computed weight = %v, want the clamped 8", cw)
	}
}

func TestPinReplacesWeightAndSurvivesRestart(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("a", "http://1:8000", "m"), 100)
	h.admit("n2", engine("b", "http://2:8000", "m"), 300)
	if err := h.f.Pin("a", 3); err != nil {
		t.Fatal(err)
	}
	wt, _ := h.f.Weights("m")
	for _, e := range wt.Workers {
		if e.ID == "a" && (e.Weight != 3 || !e.Pinned) {
			t.Errorf("pinned entry = %+v, want weight 3 pinned", e)
		}
		if e.ID == "b" && (!near(e.Weight, 1.5) || e.Pinned) {
			t.Errorf("unpinned entry = %+v, want computed 1.5", e)
		}
	}
	a := h.worker("a")
	if a.PinnedWeight == nil || *a.PinnedWeight != 3 || a.ComputedWeight == nil || !near(*a.ComputedWeight, 0.5) {
		t.Errorf("view: pinned %v computed %v", a.PinnedWeight, a.ComputedWeight)
	}

	h2 := h.restart()
	if a := h2.worker("a"); a.PinnedWeight == nil || *a.PinnedWeight != 3 || a.Weight == nil || *a.Weight != 3 {
		t.Fatalf("after restart: pinned %v weight %v, want 3 and 3", a.PinnedWeight, a.Weight)
	}
	if err := h2.f.Unpin("a"); err != nil {
		t.Fatal(err)
	}
	if w := h2.weights("m"); !near(w["a"], 0.5) {
		t.Errorf("after unpin weight = %v, want the computed 0.5", w["a"])
	}
	if _, ok := h2.st.state().Pins["a"]; ok {
		t.Error("unpin left the pin in the store")
	}
	if a := h2.restart().worker("a"); a.PinnedWeight != nil {
		t.Error("a cleared pin came back after a restart")
	}
}

func TestPinRejectsBadWeights(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("a", "http://1:8000", "m"), 100)
	before := h.weights("m")
	for _, w := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0} {
		if err := h.f.Pin("a", w); !errors.Is(err, ErrInvalid) {
			t.Errorf("Pin(%v) = %v, want ErrInvalid", w, err)
		}
	}
	if err := h.f.Pin("nobody", 2); !errors.Is(err, ErrNotFound) {
		t.Errorf("Pin(unknown) = %v, want ErrNotFound", err)
	}
	if err := h.f.Unpin("nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Unpin(unknown) = %v, want ErrNotFound", err)
	}
	if err := h.f.Unpin("a"); err != nil {
		t.Errorf("Unpin of an unpinned worker = %v, want nil", err)
	}
	if after := h.weights("m"); after["a"] != before["a"] || len(h.st.state().Pins) != 0 {
		t.Errorf("rejected pins changed something: %v → %v, store %v", before, after, h.st.state().Pins)
	}
}

func TestOnlyAdmittedWorkersAreWeighed(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("a", "http://1:8000", "m"), 100)
	h.admit("n2", engine("b", "http://2:8000", "m"), 300)
	h.connect("n3")
	h.put("n3", engine("c", "http://3:8000", "m", 24094, 2925)) // held: uneven pools
	h.result("n3", measured("c", 10000, h.clk.now()))
	if err := h.f.Pin("c", 5); err != nil {
		t.Fatal(err)
	}
	w := h.weights("m")
	if _, in := w["c"]; in || len(w) != 2 {
		t.Fatalf("weights = %v: a held (even pinned) worker must stay out", w)
	}
	// c's throughput does not count in the median: a is 100/200.
	if !near(w["a"], 0.5) {
		t.Errorf("a = %v, want 0.5 from the median of the admitted workers only", w["a"])
	}
	if c := h.worker("c"); c.Weight != nil || c.State != view.StateHeld {
		t.Errorf("held worker: state %s weight %v", c.State, c.Weight)
	}
	if _, ok := h.f.Weights("nope"); ok {
		t.Error("Weights of an unknown model reported ok")
	}
	if models := h.f.Models(); len(models) != 1 || models[0] != "m" {
		t.Errorf("Models = %v", models)
	}
}
