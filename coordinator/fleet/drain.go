package fleet

import (
	"heft/shared/view"
	"heft/shared/wire"
)

// drained reports whether the gateways should send w no new request
// while its agent measures it (the agent's probe_busy "drain"): its
// current probe request is outstanding, its agent said "draining" and is
// connected, and another admitted worker of its model keeps serving. A
// drain never leaves a model with no worker (the agent then waits for an
// idle engine or gives up): of workers that all ask at once, the one with
// the largest ID keeps serving.
func (f *Fleet) drained(w *worker) bool {
	if !f.asksDrain(w) {
		return false
	}
	for _, o := range f.byModel[w.eng.Model] {
		if o != w && view.Serving(o.state) && o.weight != nil && *o.weight > 0 && (!f.asksDrain(o) || o.id > w.id) {
			return true
		}
	}
	return false
}

// asksDrain: w's agent asked for a drain for its current probe.
func (f *Fleet) asksDrain(w *worker) bool {
	return w.probe.outstanding && w.probe.status == wire.ProbeDraining && f.connected(w)
}
