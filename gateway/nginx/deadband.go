package nginx

import (
	"math"

	"heft/gateway/target"
)

// WeightDeadband is how far, relative, a serving worker's weight may move
// from the one nginx has before heft-sync rewrites and reloads for it. A
// measured weight wobbles by a few tenths of a percent from one passive
// window to the next (bench area 11: 1.896, 1.895, 1.889, 1.897), which
// moves a weight of 1–100 by one and would reload nginx every window; each
// reload closes the kept-alive client connections (docs/gateways.md).
const WeightDeadband = 0.02

// steady returns applied when m differs from it only by weights each
// within WeightDeadband of applied's, and m otherwise: any other change (a
// worker added, gone, drained, its caps) is applied as it comes.
func steady(applied *target.Model, m target.Model) target.Model {
	if applied == nil || applied.Name != m.Name || len(applied.Backends) != len(m.Backends) {
		return m
	}
	for i, b := range m.Backends {
		a := applied.Backends[i]
		w := b.Weight
		b.Weight = a.Weight
		if b != a || math.Abs(w-a.Weight) > WeightDeadband*a.Weight {
			return m
		}
	}
	return *applied
}
