package fleet

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

// A measurement beyond what the worker could produce is held with
// implausible_measurement (critical) and takes no weight, whatever the
// reason: per GPU, per request's stream, the agent's own flag, or far
// above its model's median. An admin's admit lets it in; the verdict
// survives a restart.
func TestImplausibleMeasurementsAreHeld(t *testing.T) {
	for _, tc := range []struct {
		name string
		gpus int
		mod  func(*wire.Measurement)
		want string
	}{
		{"above any GPU", 2, func(m *wire.Measurement) { m.ThroughputTPS, m.Concurrency, m.Requests = 300000, 256, 256 }, "per GPU"},
		{"faster than any stream", 0, func(m *wire.Measurement) { m.ThroughputTPS = 383475 }, "per request"},
		{"flagged by the agent", 0, func(m *wire.Measurement) { m.Implausible = "every token of a request arrived at once" }, "the agent's probe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.connect("n")
			e := engine("k", "http://1:8000", "m")
			var gpus []wire.GPU
			for i := range tc.gpus {
				uuid := "GPU-" + string(rune('a'+i))
				gpus = append(gpus, wire.GPU{Index: i, UUID: uuid})
				e.GPUUUIDs = append(e.GPUUUIDs, uuid)
			}
			h.engines["n"] = []wire.Engine{e}
			h.f.Snapshot("n", wire.Snapshot{Node: "n", GPUs: gpus, Engines: h.engines["n"]})
			m := measured("k", 1000, h.clk.now())
			tc.mod(&m)
			h.result("n", m)
			w := h.worker("k")
			x, ok := warning(w, wire.CodeImplausibleMeasurement)
			if w.State != view.StateHeld || w.Weight != nil || !ok || x.Severity != wire.SeverityCritical || !strings.Contains(x.Message, tc.want) {
				t.Fatalf("state %s weight %v warning %+v; want held, no weight, critical %s mentioning %q", w.State, w.Weight, x, wire.CodeImplausibleMeasurement, tc.want)
			}
			if wt, _ := h.f.Weights("m"); len(wt.Workers) != 0 {
				t.Errorf("weight table %+v", wt.Workers)
			}
			// Held across a restart: the verdict is stored with the measurement.
			h = h.restart()
			h.connect("n")
			h.f.Snapshot("n", wire.Snapshot{Node: "n", GPUs: gpus, Engines: h.engines["n"]})
			if w := h.worker("k"); w.State != view.StateHeld {
				t.Fatalf("after a restart: %s", w.State)
			}
			if err := h.f.Admit("k"); err != nil {
				t.Fatal(err)
			}
			w = h.worker("k")
			x, _ = warning(w, wire.CodeImplausibleMeasurement)
			if w.State != view.StateAdmitted || w.Weight == nil || x.Severity != wire.SeverityWarning {
				t.Errorf("after admit: %s weight %v warning %+v", w.State, w.Weight, x)
			}
		})
	}
}

// The median check needs three measured workers of the model (with fewer,
// one outlier could be the median); it holds a worker more than
// ImplausibleFactor × the median, and lets it in once the median rises.
func TestOutlierAgainstTheMedian(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("a", "http://1:8000", "m"), 1000)
	h.admit("n2", engine("b", "http://2:8000", "m"), 9000) // two workers: no median to judge by yet
	h.admit("n3", engine("c", "http://3:8000", "m"), 1100)
	// a 1000, c 1100, b 9000: median 1100, b is 8.2× it.
	b := h.worker("b")
	if x, ok := warning(b, wire.CodeImplausibleMeasurement); b.State != view.StateHeld || b.Weight != nil || !ok || !strings.Contains(x.Message, "8.2×") {
		t.Fatalf("b: %s weight %v %+v", b.State, b.Weight, x)
	}
	if w := h.weights("m"); len(w) != 2 {
		t.Errorf("weights %v: want a and c only", w)
	}
	// Faster workers join: the median rises past 9000/4 and b is let in.
	h.admit("n4", engine("d", "http://4:8000", "m"), 8000)
	h.admit("n5", engine("e", "http://5:8000", "m"), 7000)
	if b := h.worker("b"); b.State != view.StateAdmitted || b.Weight == nil {
		t.Errorf("b after the median rose: %s weight %v warnings %+v", b.State, b.Weight, b.Warnings)
	}
	if _, ok := warning(h.worker("b"), wire.CodeImplausibleMeasurement); ok {
		t.Error("b still carries implausible_measurement")
	}
}

// Texts and lists of a measurement are cut to what the fleet keeps, and
// history keeps only numbers.
func TestMeasurementsAreCutToSize(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m"))
	m := measured("k", 1000, h.clk.now())
	for range wire.MaxProblemCount {
		m.Problems = append(m.Problems, strings.Repeat("p", wire.MaxStringBytes))
	}
	for range wire.MaxListItems {
		m.ClockEventReasons = append(m.ClockEventReasons, strings.Repeat("r", wire.MaxStringBytes))
	}
	m.Prompt = strings.Repeat("q", wire.MaxStringBytes)
	h.result("n", m)
	st := h.st.state()
	got := st.Latest["k"]
	if len(got.Problems) != keptProblems || len(got.Problems[0]) > keptProblemBytes || len(got.ClockEventReasons) != keptReasons ||
		len(got.Prompt) > keptTextBytes || !strings.Contains(got.Problems[keptProblems-1], "more problems not kept") {
		t.Errorf("stored: %d problems (first %d bytes), %d reasons, prompt %d bytes", len(got.Problems), len(got.Problems[0]),
			len(got.ClockEventReasons), len(got.Prompt))
	}
	if h := st.History["k"]; len(h) != 1 || h[0].Problems != nil || h[0].ClockEventReasons != nil || h[0].Prompt != "" {
		t.Errorf("history keeps texts: %+v", h)
	}
	if s := h.f.Stats(); s.MeasurementsCut != 1 {
		t.Errorf("measurements cut %d", s.MeasurementsCut)
	}
}

// The GPUs a measurement names (its burst's memory on each) and its cause
// are cut too: an agent answering probes with 240 GPUs of 4 KiB UUIDs and
// a 4 KiB cause had each kept whole, in the latest measurement and in
// each of the 50 history entries of every key it owns.
func TestMeasurementGPUsAndCauseAreCut(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", engine("k", "http://1:8000", "m"))
	m := measured("k", 1000, h.clk.now())
	for i := range 240 {
		m.GPUMemory = append(m.GPUMemory, wire.GPUMemory{UUID: fmt.Sprintf("GPU-%04d-", i) + strings.Repeat("u", 4000), UsedBytes: 1 << 30})
	}
	m.GPUMemory = append(m.GPUMemory, wire.GPUMemory{UUID: "GPU-real", UsedBytes: 1 << 30})
	m.Cause = strings.Repeat("c", wire.MaxStringBytes)
	if data, err := wire.Encode(&wire.ProbeResult{Measurement: m}); err != nil || len(data) > wire.MaxMessageBytes {
		t.Fatalf("the result does not fit one message: %d bytes, %v", len(data), err)
	}
	h.result("n", m)
	st := h.st.state()
	for what, got := range map[string]wire.Measurement{"latest": st.Latest["k"], "history": st.History["k"][0]} {
		size, _ := json.Marshal(got)
		t.Logf("%s: %d bytes kept, %d GPUs", what, len(size), len(got.GPUMemory))
		if len(got.GPUMemory) > wire.MaxGPUs || len(got.Cause) > keptTextBytes {
			t.Errorf("%s keeps %d GPUs and a cause of %d bytes; want at most %d and %d", what, len(got.GPUMemory), len(got.Cause), wire.MaxGPUs, keptTextBytes)
		}
		for _, g := range got.GPUMemory {
			if len(g.UUID) > keptReasonBytes {
				t.Errorf("%s keeps a GPU UUID of %d bytes", what, len(g.UUID))
				break
			}
		}
	}
	if got := st.Latest["k"].GPUMemory; len(got) != 1 || got[0].UUID != "GPU-real" {
		t.Errorf("latest keeps GPUs %d, want only GPU-real", len(got))
	}
}

// Chunks read in bunches by a starved agent make the decode percentiles
// high while the stream itself was slow: that is no reason to hold a
// worker (the agent judges a stream from its sending to its last token).
func TestBunchedChunksAreNotImplausible(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.engines["n"] = []wire.Engine{engine("k", "http://1:8000", "m")}
	h.f.Snapshot("n", wire.Snapshot{Node: "n", Engines: h.engines["n"]})
	m := measured("k", 1000, h.clk.now())
	m.DecodeTPSP95 = 21370 // what an honest engine read as at a load of 25
	h.result("n", m)
	w := h.worker("k")
	if _, held := warning(w, wire.CodeImplausibleMeasurement); held || w.State != view.StateAdmitted {
		t.Fatalf("state %s, warnings %+v; want admitted without %s", w.State, w.Warnings, wire.CodeImplausibleMeasurement)
	}
}
