package fleet

import (
	"strings"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

// A worker whose address the server refused is held with
// address_not_allowed, an admin's admit notwithstanding, and out of its
// model's weights; once its node offers an address it may, it returns.
func TestRefusedAddressHoldsTheWorker(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("good", "http://1:8000", "m"), 400)
	h.admit("n2", engine("sink", "http://2:8000", "m"), 400)
	if err := h.f.Admit("sink"); err != nil {
		t.Fatal(err)
	}
	h.f.SetAddressRefusals("n2", map[string]string{"sink": "10.6.6.6:80 is neither the address the node connects from (10.0.0.2) nor allowed"})
	w := h.worker("sink")
	x, ok := warning(w, wire.CodeAddressNotAllowed)
	if w.State != view.StateHeld || !ok || x.Severity != wire.SeverityCritical || !strings.Contains(x.Message, "10.6.6.6:80") {
		t.Fatalf("refused address: state %s, warning %+v (%v); want held with a critical address_not_allowed naming it", w.State, x, ok)
	}
	if ws := h.weights("m"); len(ws) != 1 {
		t.Errorf("weight table = %v, want the good worker only", ws)
	}
	h.f.SetAddressRefusals("n2", nil)
	if w := h.worker("sink"); w.State != view.StateAdmitted {
		t.Errorf("after the refusal is lifted: state %s, want admitted", w.State)
	}
	if ws := h.weights("m"); len(ws) != 2 {
		t.Errorf("weight table = %v, want both workers", ws)
	}
}
