package fleet

import (
	"strings"
	"testing"

	"heft/shared/wire"
)

// An engine restarted with the same launch arguments keeps its capacity
// key, but not its measurement: the coordinator asks again at once, the
// request and the measurement name the cause, and the history shows it.
func TestEngineChangeRemeasures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(*wire.Engine)
		after  func(*wire.Engine)
		cause  string
	}{
		{"restart", func(e *wire.Engine) { e.PID = 100 }, func(e *wire.Engine) { e.PID = 200 }, "engine_restarted: pid 100 → 200"},
		{"gpus", func(e *wire.Engine) { e.GPUUUIDs = []string{"GPU-a", "GPU-b"} }, func(e *wire.Engine) { e.GPUUUIDs = []string{"GPU-a"} },
			"gpu_set_changed: 2 GPU(s) → 1"},
		{"foreign process", nil, func(e *wire.Engine) { e.ForeignProcesses = []wire.GPUProcess{{PID: 7, Foreign: true}} },
			"foreign_gpu_process: pid 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			e := engine("k", "http://1:8000", "m")
			if tc.before != nil {
				tc.before(&e)
			}
			h.admit("n", e, 1785)
			if acts := h.put("n", e); len(requests(acts, "k")) != 0 {
				t.Fatalf("the same engine again was re-measured: %+v", acts)
			}
			tc.after(&e)
			r := requests(h.put("n", e), "k")
			if len(r) != 1 || r[0].Reason != wire.ReasonOnDemand || !strings.HasPrefix(r[0].Cause, tc.cause) {
				t.Fatalf("requests %+v, want one on-demand request with cause %q", r, tc.cause)
			}
			if acts := h.f.Tick(); len(requests(acts, "k")) != 0 {
				t.Errorf("asked twice: %+v", acts)
			}
			m := measured("k", 890, h.clk.now())
			m.Trigger, m.Cause = r[0].Reason, r[0].Cause
			h.result("n", m)
			w := h.worker("k")
			if *w.Throughput != 890 || w.History[len(w.History)-1].Cause != r[0].Cause {
				t.Errorf("after: throughput %v history %+v", *w.Throughput, w.History)
			}
			if acts := h.put("n", e); len(requests(acts, "k")) != 0 {
				t.Errorf("measured engine re-measured again: %+v", acts)
			}
		})
	}
}
