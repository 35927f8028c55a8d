package fleet

import (
	"testing"

	"heft/shared/view"
)

// An agent newer than the coordinator may report an engine kind this
// build does not know: the worker is kept, shown with that kind, and
// measured like any other.
func TestUnknownEngineKind(t *testing.T) {
	h := newHarness(t)
	e := engine("tgi-1", "http://1:8080", "m", 9000)
	e.Kind = "tgi"
	h.admit("n1", e, 500)
	if w := h.worker("tgi-1"); w.Engine != "tgi" || w.State != view.StateAdmitted {
		t.Fatalf("engine %q state %s", w.Engine, w.State)
	}
}
