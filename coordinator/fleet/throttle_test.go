package fleet

import (
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
