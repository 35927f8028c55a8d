package fleet

import (
	"testing"

	"heft/shared/view"
)

// A hold below the floor is a hold the API shows as one, marked
// below_floor; it is stored as such and survives a restart; a plain hold
// replaces the mark and Admit clears both.
func TestHoldBelowFloor(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 500)

	if err := h.f.HoldBelowFloor("k"); err != nil {
		t.Fatal(err)
	}
	w := h.worker("k")
	if w.State != view.StateHeld || w.AdminDecision != DecisionHold || !w.BelowFloor || w.Weight != nil {
		t.Fatalf("after a hold below the floor: state %s decision %q below_floor %t weight %v", w.State, w.AdminDecision, w.BelowFloor, w.Weight)
	}
	if d := h.st.state().Decisions["k"]; d != DecisionHoldBelowFloor {
		t.Errorf("stored decision %q, want %q", d, DecisionHoldBelowFloor)
	}
	for _, ws := range h.f.Stats().Workers {
		if ws.ID == "k" && ws.HoldReason != HoldAdmin {
			t.Errorf("hold reason %q, want %q", ws.HoldReason, HoldAdmin)
		}
	}

	h2 := h.restart()
	h2.connect("n")
	h2.snapshot("n")
	if w := h2.worker("k"); w.State != view.StateHeld || w.AdminDecision != DecisionHold || !w.BelowFloor {
		t.Errorf("after a restart: state %s decision %q below_floor %t", w.State, w.AdminDecision, w.BelowFloor)
	}

	if err := h2.f.Hold("k"); err != nil {
		t.Fatal(err)
	}
	if w := h2.worker("k"); w.State != view.StateHeld || w.BelowFloor {
		t.Errorf("a plain hold kept the below-floor mark: state %s below_floor %t", w.State, w.BelowFloor)
	}
	if d := h2.st.state().Decisions["k"]; d != DecisionHold {
		t.Errorf("stored decision after a plain hold %q, want %q", d, DecisionHold)
	}

	if err := h2.f.HoldBelowFloor("k"); err != nil {
		t.Fatal(err)
	}
	if err := h2.f.Admit("k"); err != nil {
		t.Fatal(err)
	}
	if w := h2.worker("k"); w.State != view.StateAdmitted || w.AdminDecision != "" || w.BelowFloor {
		t.Errorf("after admit: state %s decision %q below_floor %t", w.State, w.AdminDecision, w.BelowFloor)
	}
	if _, ok := h2.st.state().Decisions["k"]; ok {
		t.Error("the cleared decision is still stored")
	}
}
