package fleet

import (
	"testing"

	"heft/shared/wire"
)

// probe_busy "drain": while a busy worker's agent measures it, its
// gateway weight reads 0 (every gateway stops sending it requests), its
// computed weight stays, and the drain ends with the probe's result.
func TestDrainWhileMeasured(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("a", "http://1:8000", "m"), 1800)
	h.admit("n2", engine("b", "http://2:8000", "m"), 900)

	acts, err := h.f.Probe("a")
	if err != nil || len(requests(acts, "a")) != 1 {
		t.Fatalf("Probe: %v %+v", err, acts)
	}
	id := h.requestID("a")
	h.f.ProbeStatus("n1", wire.ProbeStatus{RequestID: id, CapacityKey: "a", State: wire.ProbeDraining})
	w := h.worker("a")
	if !w.Draining || w.Weight == nil || *w.Weight != 0 || w.ComputedWeight == nil || *w.ComputedWeight <= 0 || w.ProbeStatus != wire.ProbeDraining {
		t.Fatalf("while draining: draining %v weight %v computed %v status %q", w.Draining, w.Weight, w.ComputedWeight, w.ProbeStatus)
	}
	if ws := h.weights("m"); len(ws) != 1 || ws["b"] == 0 {
		t.Errorf("weight table while a drains: %v", ws)
	}
	if b := h.worker("b"); b.Draining || *b.Weight <= 0 {
		t.Errorf("b drained too: %+v", b.Weight)
	}

	m := measured("a", 1790, h.clk.now())
	m.Drained = true
	h.result("n1", m)
	if w := h.worker("a"); w.Draining || w.Weight == nil || *w.Weight <= 0 {
		t.Fatalf("after the result: draining %v weight %v", w.Draining, w.Weight)
	}
	if ws := h.weights("m"); len(ws) != 2 {
		t.Errorf("weight table after: %v", ws)
	}
}

// A drain never leaves a model without a worker, and ends when the
// agent's connection does.
func TestDrainNeverEmptiesAModel(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("a", "http://1:8000", "m"), 1800)
	if _, err := h.f.Probe("a"); err != nil {
		t.Fatal(err)
	}
	h.f.ProbeStatus("n1", wire.ProbeStatus{RequestID: h.requestID("a"), CapacityKey: "a", State: wire.ProbeDraining})
	if w := h.worker("a"); w.Draining || *w.Weight <= 0 {
		t.Fatalf("the model's only worker drained: weight %v", *w.Weight)
	}

	h.admit("n2", engine("b", "http://2:8000", "m"), 900)
	if _, err := h.f.Probe("b"); err != nil {
		t.Fatal(err)
	}
	h.f.ProbeStatus("n2", wire.ProbeStatus{RequestID: h.requestID("b"), CapacityKey: "b", State: wire.ProbeDraining})
	if a, b := h.worker("a"), h.worker("b"); !a.Draining || b.Draining {
		t.Fatalf("both ask: a drained %v, b drained %v; want exactly a", a.Draining, b.Draining)
	}
	h.disconnect("n1")
	if h.worker("a").Draining || !h.worker("b").Draining {
		t.Error("a's drain outlived its agent's connection, or b's did not follow")
	}
}
