package fleet

import (
	"heft/shared/view"
	"heft/shared/wire"
)

// Hold reasons: why a held worker is out of the weight table, in the order
// evaluate decides them.
const (
	HoldAdmin       = "admin"               // an admin held it
	HoldInvalid     = "invalid_measurement" // its newest measurement is not valid
	HoldPools       = "dp_pool_imbalance"   // its data-parallel pools differ past thresholds.pool_hold
	HoldImplausible = "implausible_measurement"
	HoldOutlier     = "outlier" // far above its model's median
)

// HoldReasons lists every hold reason.
var HoldReasons = []string{HoldAdmin, HoldInvalid, HoldPools, HoldImplausible, HoldOutlier}

// holdReason says why a held worker is held; "" for one that is not.
// Called with f.mu held.
func (f *Fleet) holdReason(w *worker) string {
	if w.state != view.StateHeld {
		return ""
	}
	decision := f.decisions[w.id]
	if isHold(decision) {
		return HoldAdmin
	}
	if m := f.newest(w.id); m != nil && !w.placeholder && !m.Valid() {
		return HoldInvalid
	}
	if w.outlierHeld() {
		return HoldOutlier
	}
	for _, x := range w.findings {
		if x.Code == wire.CodeDPPoolImbalance && x.Severity == wire.SeverityCritical && decision != DecisionAdmit {
			return HoldPools
		}
	}
	return HoldImplausible
}
