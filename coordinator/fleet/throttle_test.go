package fleet

import (
	"math"
	"strings"
	"testing"
	"time"

	"heft/shared/wire"
)

// A GPU that reports a slowdown reason for ThrottleSustained re-measures
// its worker once per throttled spell; a power cap, a short spell or a
// throttle the measurement itself saw does not.
func TestGPUThrottleRemeasures(t *testing.T) {
	h := newHarness(t)
	gpu := func(reasons ...string) []wire.GPU {
		return []wire.GPU{{Index: 0, UUID: "GPU-a", ClockEventReasons: reasons}}
	}
	h.gpus["n"] = gpu()
	e := engine("k", "http://1:8000", "m")
	e.GPUUUIDs = []string{"GPU-a"}
	h.admit("n", e, 1785)
	step := func(d time.Duration, reasons ...string) []*wire.ProbeRequest {
		h.clk.advance(d)
		h.gpus["n"] = gpu(reasons...)
		return requests(h.snapshot("n"), "k")
	}
	// A power cap is how a GPU under load runs: no cause, however long.
	for range 3 {
		if r := step(40*time.Second, "sw_power_cap"); len(r) != 0 {
			t.Fatalf("a power cap re-measured: %+v", r)
		}
	}
	// Thermal slowdown for 40 s, then gone: too short.
	if r := step(time.Second, "hw_thermal_slowdown"); len(r) != 0 {
		t.Fatalf("at once: %+v", r)
	}
	step(40*time.Second, "hw_thermal_slowdown")
	if r := step(40 * time.Second); len(r) != 0 {
		t.Fatalf("a 40 s spell re-measured: %+v", r)
	}
	// Sustained past a minute: one request, named.
	step(time.Second, "sw_power_cap", "hw_thermal_slowdown")
	step(30*time.Second, "hw_thermal_slowdown")
	r := step(31*time.Second, "hw_thermal_slowdown")
	if len(r) != 1 || !strings.HasPrefix(r[0].Cause, "gpu_clocks_throttled: hw_thermal_slowdown on GPU 0 for 1m1s") {
		t.Fatalf("after 61 s throttled: %+v", r)
	}
	m := measured("k", 1200, h.clk.now())
	m.Trigger, m.Cause = r[0].Reason, r[0].Cause
	h.result("n", m)
	// Still throttled, as when measured: nothing more.
	if r := step(5*time.Minute, "hw_thermal_slowdown"); len(r) != 0 {
		t.Fatalf("re-measured again in the same spell: %+v", r)
	}
	// The spell ends; a new one that lasts asks again.
	step(10 * time.Second)
	step(time.Second, "hw_slowdown")
	if r := step(2*time.Minute, "hw_slowdown"); len(r) != 1 || !strings.Contains(r[0].Cause, "hw_slowdown on GPU 0") {
		t.Fatalf("a second spell: %+v", r)
	}
}

// From the first snapshot whose GPUs report a slowdown, a worker's weight
// counts its measurement over the clock factor (its burst's SM clock over
// the GPUs' clock now). Once two pace readings taken wholly in the spell
// have come, the pace decides: here the engine slowed by 1.6 while its
// clock halved (decode is partly bound by memory), so the weight rises
// from a half to 1/1.6 of the measurement. A paced throttle asks for no
// probe, not even past ThrottleSustained; the spell's end restores the
// measurement.
func TestGPUThrottleRescalesByClockThenPace(t *testing.T) {
	h := newHarness(t)
	gpu := func(mhz uint32, reasons ...string) []wire.GPU {
		return []wire.GPU{{Index: 0, UUID: "GPU-a", SMClockMHz: mhz, SMClockMaxMHz: 1980, ClockEventReasons: reasons}}
	}
	h.gpus["n"] = gpu(1980)
	a, b := engine("a", "http://1:8000", "m"), engine("b", "http://2:8000", "m")
	a.GPUUUIDs = []string{"GPU-a"}
	h.connectOnce("n")
	h.put("n", a)
	h.put("n", b)
	for _, e := range []wire.Engine{a, b} {
		m := measured(e.CapacityKey, 2000, h.clk.now())
		m.DecodeTPSP50, m.SMClockMedianMHz = 125, 1980
		h.result("n", m)
	}
	ratio := func() float64 { w := h.weights("m"); return w["a"] / w["b"] }
	var asked []*wire.ProbeRequest
	snap := func(d time.Duration, g []wire.GPU, pace *wire.Pace) {
		h.clk.advance(d)
		h.gpus["n"], a.Pace = g, pace
		asked = append(asked, requests(h.put("n", a), "a")...)
	}
	reading := func(factor float64) *wire.Pace {
		return &wire.Pace{At: h.clk.now().Add(10 * time.Second), WindowSeconds: 10, SecondsPerToken: factor * 0.008, Batch: 16}
	}
	// A power cap at full clock is how a GPU under load runs.
	snap(5*time.Second, gpu(1980, "sw_power_cap"), nil)
	if got := h.worker("a").WeightSource; got != SourceMeasured || ratio() != 1 {
		t.Fatalf("power cap: source %q, ratio %v", got, ratio())
	}
	// Thermal slowdown at half the clock: half the weight at once.
	snap(5*time.Second, gpu(990, "hw_thermal_slowdown"), nil)
	w := h.worker("a")
	if w.WeightSource != SourceClock || w.ClockFactor != 2 || math.Abs(ratio()-0.5) > 1e-9 {
		t.Fatalf("throttled: source %q clock factor %v, ratio %v; want gpu_clock, 2, 0.5", w.WeightSource, w.ClockFactor, ratio())
	}
	// A reading whose window began before the spell does not count, even
	// slow: with the one after it, it starts a pace rescale by 1.3, which
	// read too little of the throttle to count. Two taken in the spell at
	// 1.6 times the reference hand the weight to the pace.
	snap(2*time.Second, gpu(990, "hw_thermal_slowdown"), &wire.Pace{At: h.clk.now(), WindowSeconds: 10, SecondsPerToken: 1.3 * 0.008, Batch: 16})
	snap(10*time.Second, gpu(990, "hw_thermal_slowdown"), reading(1.6))
	if w := h.worker("a"); w.WeightSource != SourceClock || math.Abs(ratio()-0.5) > 1e-9 {
		t.Fatalf("after one reading in the spell: source %q, ratio %v; want gpu_clock still, 0.5", w.WeightSource, ratio())
	}
	snap(10*time.Second, gpu(990, "hw_thermal_slowdown"), reading(1.6))
	if w := h.worker("a"); w.WeightSource != SourceRescaled || math.Abs(w.PaceFactor-1.6) > 1e-9 || math.Abs(ratio()-1/1.6) > 1e-9 {
		t.Fatalf("paced: source %q factor %v, ratio %v; want rescaled, 1.6, %v", w.WeightSource, w.PaceFactor, ratio(), 1/1.6)
	}
	// Past ThrottleSustained, followed by its pace: no probe.
	for range 6 {
		snap(10*time.Second, gpu(990, "hw_thermal_slowdown"), reading(1.6))
	}
	if len(asked) != 0 {
		t.Fatalf("a throttle followed by the pace asked for a probe: %+v", asked[0])
	}
	// The spell ends and the pace agrees again: the measurement counts.
	snap(10*time.Second, gpu(1980), reading(1))
	snap(10*time.Second, gpu(1980), reading(1))
	if w := h.worker("a"); w.WeightSource != SourceMeasured || ratio() != 1 {
		t.Fatalf("recovered: source %q, ratio %v", w.WeightSource, ratio())
	}
	// A spell in which the pace sees no slowdown: the clock factor counts
	// until two readings in the spell say so, then the measurement.
	snap(10*time.Second, gpu(990, "hw_slowdown"), nil)
	if got := h.worker("a").WeightSource; got != SourceClock {
		t.Fatalf("second spell: source %q", got)
	}
	snap(10*time.Second, gpu(990, "hw_slowdown"), reading(1.05))
	snap(10*time.Second, gpu(990, "hw_slowdown"), reading(1.05))
	if w := h.worker("a"); w.WeightSource != SourceMeasured || ratio() != 1 {
		t.Fatalf("clock halved, pace unchanged: source %q, ratio %v", w.WeightSource, ratio())
	}
	snap(10*time.Second, gpu(1980), nil)
	// A clock that is unknown, or an absurd one, does not take the weight.
	snap(10*time.Second, gpu(0, "hw_slowdown"), nil)
	if w := h.worker("a"); w.WeightSource != SourceMeasured {
		t.Fatalf("unknown clock: source %q", w.WeightSource)
	}
	snap(10*time.Second, gpu(1, "hw_slowdown"), nil)
	if w := h.worker("a"); w.ClockFactor != MaxClockFactor {
		t.Fatalf("clock of 1 MHz: factor %v, want the bound %v", w.ClockFactor, MaxClockFactor)
	}
}

// clockFactor reads the slowest GPU, rounds, and ignores a ratio within
// PaceTolerance or a measurement that did not sample clocks.
func TestClockFactor(t *testing.T) {
	m := &wire.Measurement{SMClockMedianMHz: 1980}
	g := func(mhz uint32, reasons ...string) wire.GPU {
		return wire.GPU{SMClockMHz: mhz, ClockEventReasons: reasons}
	}
	for _, c := range []struct {
		gpus []wire.GPU
		want float64
	}{
		{[]wire.GPU{g(990)}, 0},                                    // no slowdown reported
		{[]wire.GPU{g(990, "hw_slowdown")}, 2},                     // half
		{[]wire.GPU{g(1800, "hw_slowdown")}, 0},                    // 1.1: within tolerance
		{[]wire.GPU{g(1980), g(1320, "sw_thermal_slowdown")}, 1.5}, // the slowest of two
		{[]wire.GPU{g(1500, "hw_power_brake_slowdown")}, 1.3},      // 1.32 rounded
		{[]wire.GPU{{SMClockMHz: 500, Error: "gone", ClockEventReasons: []string{"hw_slowdown"}}}, 0},
	} {
		if got := clockFactor(c.gpus, m); got != c.want {
			t.Errorf("%+v: %v, want %v", c.gpus, got, c.want)
		}
	}
	if got := clockFactor([]wire.GPU{g(990, "hw_slowdown")}, &wire.Measurement{}); got != 0 {
		t.Errorf("a measurement without clocks: %v", got)
	}
}
