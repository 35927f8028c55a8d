package fleet

import (
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

// Issue 25: a released name went to whoever asked for it next, with the
// worker's pin 3.0 and its cached 1,979 tok/s, no probe: 82.8 % of the
// model's weight. Forgetting the node drops its workers, keys, pins,
// decisions and measurements, here and in the store, so the name's next
// holder is measured and judged afresh. Before: the re-bound worker was
// admitted at once with pin 3.0; after: it waits for a probe, unpinned.
func TestForgetNodeLeavesNothingToInherit(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("good", "http://1:8000", "m"), 1000)
	h.admit("n2", engine("victim", "http://2:8000", "m"), 1979)
	if err := h.f.Pin("victim", 3.0); err != nil {
		t.Fatal(err)
	}
	if err := h.f.Hold("victim"); err != nil {
		t.Fatal(err)
	}
	if err := h.f.ForgetNode("n2"); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.f.Worker("victim"); ok {
		t.Error("the forgotten node's worker is still listed")
	}
	st := h.st.state()
	_, pin := st.Pins["victim"]
	_, decision := st.Decisions["victim"]
	_, latest := st.Latest["victim"]
	_, record := st.Workers["victim"]
	if pin || decision || latest || record {
		t.Errorf("stored after forgetting: pin %v, decision %v, measurement %v, worker record %v", pin, decision, latest, record)
	}

	// Whoever binds the name next lists the same engine.
	h.disconnect("n2")
	acts := h.connect("n2")
	acts = append(acts, h.put("n2", engine("victim", "http://6:8000", "m"))...)
	w := h.worker("victim")
	if w.PinnedWeight != nil || w.AdminDecision != "" || w.State == view.StateAdmitted {
		t.Errorf("re-bound worker: state %s, pin %v, decision %q; want unpinned, undecided, not admitted", w.State, w.PinnedWeight, w.AdminDecision)
	}
	probed := false
	for _, a := range acts {
		if r, ok := a.Message.(*wire.ProbeRequest); ok && r.CapacityKey == "victim" {
			probed = true
		}
	}
	if !probed {
		t.Error("the re-bound worker was not asked for a probe")
	}
	if ws := h.weights("m"); len(ws) != 1 {
		t.Errorf("weight table = %v, want the good worker alone", ws)
	}
}
