package fleet

import (
	"strings"
	"testing"
	"time"

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
			h.gpus["n"] = []wire.GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}} // an engine's gpu_uuids are the node's
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

// Passive readings: one below the measurement is noted, two in a row
// re-measure the worker; readings at or above it never do.
func TestPassiveBelowMeasurementRemeasures(t *testing.T) {
	h := newHarness(t)
	e := engine("k", "http://1:8000", "m")
	h.admit("n", e, 1785)
	reading := func(s int, tps float64) []*wire.ProbeRequest {
		e.Passive = &wire.Passive{At: h.clk.now().Add(time.Duration(s) * time.Second), WindowSeconds: 30, ThroughputTPS: tps, Concurrency: 16}
		return requests(h.put("n", e), "k")
	}
	if r := reading(30, 2400); len(r) != 0 { // more running than the burst: more delivered
		t.Fatalf("a reading above the measurement re-measured: %+v", r)
	}
	if r := reading(60, 900); len(r) != 0 {
		t.Fatalf("one low reading re-measured: %+v", r)
	}
	if w := h.worker("k"); w.Passive == nil || w.Passive.ThroughputTPS != 900 {
		t.Errorf("view passive %+v", w.Passive)
	}
	if r := requests(h.put("n", e), "k"); len(r) != 0 { // the same reading again is not a second one
		t.Fatalf("a repeated reading re-measured: %+v", r)
	}
	r := reading(90, 880)
	if len(r) != 1 || !strings.HasPrefix(r[0].Cause, "passive_below_measurement: 880 tok/s over 30 s with 16 running, measured 1785") {
		t.Fatalf("after two low readings: %+v", r)
	}
}
