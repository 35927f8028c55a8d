package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"heft/shared/wire"
)

// A GPU that reports a slowdown reason (NVML clock event reasons: hardware
// slowdown, thermal, power brake) for ThrottleSustained is running slower
// than when its engine was measured, unless the measurement itself saw the
// same: the worker is measured again, cause CauseGPUThrottled, as
// probe_busy allows. A power cap alone is no cause: a GPU under load runs
// at its power limit, as it did when measured.
const (
	CauseGPUThrottled = "gpu_clocks_throttled"
	ThrottleSustained = time.Minute
)

var slowdownReasons = []string{"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}

// slowdowns lists the slowdown reasons the GPUs report, each once, with the
// first GPU that reports it.
func slowdowns(gpus []wire.GPU) []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range gpus {
		for _, r := range g.ClockEventReasons {
			if slices.Contains(slowdownReasons, r) && !seen[r] {
				seen[r] = true
				out = append(out, fmt.Sprintf("%s on GPU %d", r, g.Index))
			}
		}
	}
	return out
}

// noteThrottle follows how long w's GPUs have reported a slowdown and
// marks w for a re-measurement once it lasted ThrottleSustained, once per
// throttled spell.
func (f *Fleet) noteThrottle(w *worker, now time.Time) {
	why := slowdowns(w.gpus)
	if len(why) == 0 {
		w.throttledSince, w.throttleAsked = time.Time{}, false
		return
	}
	if w.throttledSince.IsZero() {
		w.throttledSince = now
	}
	lasted := now.Sub(w.throttledSince)
	if w.throttleAsked || w.placeholder || lasted < ThrottleSustained {
		return
	}
	w.throttleAsked = true
	m := f.newest(w.id)
	if m == nil || !m.Valid() || m.FinishedAt.After(w.throttledSince) {
		return // measured while throttled already (or not yet at all)
	}
	cause := fmt.Sprintf("%s: %s for %s", CauseGPUThrottled, strings.Join(why, ", "), lasted.Round(time.Second))
	if w.remeasure == "" {
		f.log.Info("engine's GPUs throttled since its measurement; measuring it again", "worker", w.id, "cause", cause)
		w.remeasure = cause
	}
}
