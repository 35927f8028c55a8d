package fleet

import (
	"fmt"
	"slices"

	"heft/shared/wire"
)

// Causes of a re-measurement beyond the schedule: the engine changed
// under the same capacity key (same node, model and launch arguments),
// so its cached measurement may no longer be what it delivers.
const (
	CauseEngineRestarted = "engine_restarted"
	CauseGPUSetChanged   = "gpu_set_changed"
	CauseForeignProcess  = "foreign_gpu_process"
	CausePassiveLow      = "passive_below_measurement"
)

// A passive reading (the engine's own counters over a window in which
// every rank ran at least the probe's per-rank burst with work waiting)
// below the measurement by more than PassiveTolerance, PassiveReadings
// times in a row, means the engine slowed down: it is measured again. A
// reading above it is no disagreement: an engine that runs more requests
// at once than the burst delivers more.
const (
	PassiveTolerance = 0.15
	PassiveReadings  = 2
)

// engineChanged names what changed between two snapshots of one worker's
// engine that makes its measurement stale, or "". Facts one side does not
// report (a pid of 0, no GPU list) are never a change.
func engineChanged(old, e wire.Engine) string {
	switch {
	case old.PID > 0 && e.PID > 0 && old.PID != e.PID:
		return fmt.Sprintf("%s: pid %d → %d", CauseEngineRestarted, old.PID, e.PID)
	case len(old.GPUUUIDs) > 0 && len(e.GPUUUIDs) > 0 && !sameSet(old.GPUUUIDs, e.GPUUUIDs):
		return fmt.Sprintf("%s: %d GPU(s) → %d", CauseGPUSetChanged, len(old.GPUUUIDs), len(e.GPUUUIDs))
	case len(old.ForeignProcesses) == 0 && len(e.ForeignProcesses) > 0:
		return fmt.Sprintf("%s: pid %d appeared on the engine's GPUs", CauseForeignProcess, e.ForeignProcesses[0].PID)
	}
	return ""
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// noteChange marks w for a re-measurement now when its engine changed
// (probeDue sends it, as an on-demand probe with the cause named).
func (f *Fleet) noteChange(w *worker, e wire.Engine) {
	if w.placeholder || w.eng.CapacityKey == "" {
		return
	}
	why := engineChanged(w.eng, e)
	if why == "" {
		why = f.passiveLowCause(w, e.Passive)
	}
	if slower := f.notePace(w, e.Pace); why == "" {
		why = slower
	}
	if why != "" {
		if w.remeasure == "" {
			f.log.Info("engine changed under the same capacity key; measuring it again", "worker", w.id, "cause", why)
		}
		w.remeasure = why
	}
}

// passiveLowCause counts a new passive reading against w's valid
// measurement and names the cause once PassiveReadings in a row were
// below it by more than PassiveTolerance.
func (f *Fleet) passiveLowCause(w *worker, p *wire.Passive) string {
	if p == nil || (w.eng.Passive != nil && w.eng.Passive.At.Equal(p.At)) {
		return ""
	}
	m := f.newest(w.id)
	if m == nil || !m.Valid() || !p.At.After(m.FinishedAt) {
		return ""
	}
	if p.ThroughputTPS >= m.ThroughputTPS*(1-PassiveTolerance) {
		w.passiveLow = 0
		return ""
	}
	w.passiveLow++
	if w.passiveLow < PassiveReadings {
		return ""
	}
	w.passiveLow = 0
	return fmt.Sprintf("%s: %.0f tok/s over %.0f s with %d running, measured %.0f", CausePassiveLow, p.ThroughputTPS, p.WindowSeconds, p.Concurrency, m.ThroughputTPS)
}
