package fleet

import (
	"fmt"

	"heft/shared/health"
	"heft/shared/wire"
)

// A node is bounded by physics: its workers' throughputs together, over
// every model, cannot exceed what the distinct GPUs it reports can
// deliver, MaxTPSPerGPU each. Each engine's own figure may be plausible
// while a node listing 32 engines over the same two GPUs claims sixteen
// times what those GPUs can do; its workers' weights are then scaled down
// together by the node's bound over its total, so the node holds what its
// GPUs could, whatever it says. The model's median is left as measured,
// so one node's many workers cannot make honest ones look like outliers
// by being scaled. A pinned weight is an admin's and is left as it is.

// nodeBound returns the factor (at most 1) the throughputs of a node's
// workers are scaled by to fit its GPUs, and the node's measured total.
// It is 1 while the bound is off, or the node has not said
// since the coordinator started how many GPUs it has.
func (f *Fleet) nodeBound(name string) (factor, total float64) {
	n := f.nodes[name]
	if f.cfg.MaxTPSPerGPU <= 0 || n == nil || !n.gpusKnown {
		return 1, 0
	}
	total = n.totalTPS()
	limit := f.cfg.MaxTPSPerGPU * float64(max(1, n.gpus))
	if total <= limit {
		return 1, total
	}
	return limit / total, total
}

// bindNode scales the weight of a worker whose node is over its bound,
// and sets the finding that says so.
func (f *Fleet) bindNode(w *worker) {
	w.boundNote = nil
	if w.weight == nil {
		return
	}
	factor, total := f.nodeBound(w.node)
	if factor >= 1 {
		return
	}
	if _, pinned := f.pins[w.id]; pinned {
		return
	}
	v := *w.weight * factor
	if !validWeight(v) {
		return
	}
	w.weight = &v
	x := health.Finding{Code: wire.CodeNodeCapacityCapped, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
		"node %s's workers measured %.0f tok/s together, more than its %d distinct GPU(s) deliver at %.4g tok/s each "+
			"(plausibility.max_tps_per_gpu): each of its weights was scaled to %.1f %%. Check which engines the node lists on the same GPUs.",
		w.node, total, max(1, f.nodes[w.node].gpus), f.cfg.MaxTPSPerGPU, factor*100)}
	w.boundNote = &x
}

// totalTPS is the node's workers' throughputs together, summed again
// after one of them changed (tpsStale): a large model's weighing asks for
// it for each of its workers.
func (n *node) totalTPS() float64 {
	if n.tpsStale {
		n.tps = 0
		for _, w := range n.workers {
			n.tps += w.tps
		}
		n.tpsStale = false
	}
	return n.tps
}

// markNodeModels marks every model a node's workers serve for weighing
// again: the node's bound ties their weights together. Its total
// throughput is summed again when next asked for.
func (f *Fleet) markNodeModels(name string) {
	n := f.nodes[name]
	if n == nil {
		return
	}
	n.tpsStale = true
	if f.cfg.MaxTPSPerGPU <= 0 {
		return
	}
	for _, w := range n.workers {
		f.dirty[w.eng.Model] = true
	}
}
