package fleet

import (
	"fmt"
	"math"
	"strings"
	"time"

	"heft/shared/wire"
)

// A GPU that reports a slowdown reason (NVML clock event reasons: hardware
// slowdown, thermal, power brake) runs slower than when its engine was
// measured, unless the measurement itself saw the same. A power cap alone
// is no slowdown: a GPU under load runs at its power limit, as it did when
// measured.
//
// From the first snapshot that reports one, the worker's capacity is its
// measurement over the clock factor: the SM clock its burst ran at over
// the lowest its GPUs run at now (weight source SourceClock). Decode is
// partly bound by memory, which a thermal throttle slows less, so the
// factor is the most the engine can have slowed; its pace (pace.go) says
// how much it did: once PaceReadings readings whose windows began in the
// throttled spell have come, the pace decides, rescaling by what it saw
// or, if it saw no slowdown, not at all. A spell that lasts
// ThrottleSustained with no pace reading in it (an engine that is not
// serving, or whose pace is not read) measures the worker again, cause
// CauseGPUThrottled, as probe_busy allows; one the pace follows asks for
// no probe, which in drain mode would take the worker out of the
// gateways while the fleet is short.
const (
	CauseGPUThrottled = "gpu_clocks_throttled"
	ThrottleSustained = time.Minute
	// MaxClockFactor bounds the clock factor: one bad clock reading must
	// not take a worker's whole weight.
	MaxClockFactor = 10
	// SourceClock is the weight source of a worker routed by its clock
	// factor.
	SourceClock = "gpu_clock"
)

// slowdowns lists the slowdown reasons the GPUs report, each once, with the
// first GPU that reports it.
func slowdowns(gpus []wire.GPU) []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range gpus {
		for _, r := range wire.Slowdowns(g.ClockEventReasons) {
			if !seen[r] {
				seen[r] = true
				out = append(out, fmt.Sprintf("%s on GPU %d", r, g.Index))
			}
		}
	}
	return out
}

// clockFactor is how many times slower gpus clock now than they did
// during m's burst, while one of them reports a slowdown reason: m's median
// SM clock over the lowest SM clock among them (the slowest GPU paces a
// tensor-parallel step), rounded to 0.05 so that a wobbling clock does not
// move the weight at every snapshot. It is 0 when no slowdown is reported,
// a clock is unknown, or the ratio is within PaceTolerance.
func clockFactor(gpus []wire.GPU, m *wire.Measurement) float64 {
	if m.SMClockMedianMHz <= 0 || len(slowdowns(gpus)) == 0 {
		return 0
	}
	var low uint32
	for _, g := range gpus {
		if g.Error == "" && g.SMClockMHz > 0 && (low == 0 || g.SMClockMHz < low) {
			low = g.SMClockMHz
		}
	}
	if low == 0 {
		return 0
	}
	r := math.Round(m.SMClockMedianMHz/float64(low)*20) / 20
	if r <= 1+PaceTolerance {
		return 0
	}
	return min(r, MaxClockFactor)
}

// clockFactor is the clock factor w's capacity counts of m: 0 once the
// pace has read the throttled engine PaceReadings times and so decides.
func (w *worker) clockFactor(m *wire.Measurement) float64 {
	if w.throttleReadings >= PaceReadings {
		return 0
	}
	return clockFactor(w.gpus, m)
}

// noteThrottle follows how long w's GPUs have reported a slowdown and
// marks w for a re-measurement once it lasted ThrottleSustained with no
// pace reading in it, once per throttled spell.
func (f *Fleet) noteThrottle(w *worker, now time.Time) {
	why := slowdowns(w.gpus)
	if len(why) == 0 {
		w.throttledSince, w.throttleAsked, w.throttleReadings = time.Time{}, false, 0
		return
	}
	if w.throttledSince.IsZero() {
		w.throttledSince = now
		if m := f.newest(w.id); m != nil && m.Valid() && !w.placeholder {
			if c := clockFactor(w.gpus, m); c > 0 {
				f.log.Info("engine's GPUs throttled; its capacity counts its clock factor until its pace says how much slower it runs",
					"worker", w.id, "reasons", strings.Join(why, ", "), "clock_factor", c, "capacity", m.ThroughputTPS/c)
			}
		}
	}
	lasted := now.Sub(w.throttledSince)
	if w.throttleAsked || w.placeholder || lasted < ThrottleSustained || w.pacedAt.After(w.throttledSince) {
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
