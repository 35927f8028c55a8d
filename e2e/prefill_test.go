package e2e

import (
	"math"
	"net/http"
	"path/filepath"
	"testing"

	"heft/bench"
	"heft/coordinator/fleet"
	"heft/shared/view"
)

// TestPrefillWeight runs real agents' probes, prefill burst included, of
// two sims whose decode and prefill rankings disagree (the bench's h20-like
// and 4090-dp2 calibrations): the coordinator weighs each table by its own
// throughput, serves both tables, and knows what each worker can hold.
func TestPrefillWeight(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := startCoordinator(t, filepath.Join(dir, "state"), "127.0.0.1:0")
	h20Cal, dp2Cal := bench.PrefillCalibrations[0], bench.PrefillCalibrations[3]
	if h20Cal.Name != "h20-like" || dp2Cal.Name != "4090-dp2" {
		t.Fatalf("calibrations %s and %s, want h20-like and 4090-dp2", h20Cal.Name, dp2Cal.Name)
	}
	h20Log, dp2Log := filepath.Join(dir, "h20.log"), filepath.Join(dir, "dp2.log")
	h20Cfg, dp2Cfg := h20Cal.SimConfig(model, bench.Cold{}), dp2Cal.SimConfig(model, bench.Cold{})
	h20Cfg.LogPath, dp2Cfg.LogPath = h20Log, dp2Log
	h20 := startSim(t, h20Cfg, "127.0.0.1:0")
	dp2 := startSim(t, dp2Cfg, "127.0.0.1:0")
	// Prompts of 4,096 tokens halve the prefill bursts; the agents run
	// them by default.
	const probe = "[probe]\nprefill_tokens = 4096"
	coordURL := "ws://" + c.addr + "/api/v1/agent"
	startAgentWith(t, coordURL, probe, "gpu-h20", "vllm", h20.URL(), h20Log)
	startAgentWith(t, coordURL, probe, "gpu-dp2", "sglang", dp2.URL(), dp2Log)

	ws := c.waitFor(t, "both workers with a prefill weight", measuredWithin, func(ws []view.Worker) bool {
		n := 0
		for _, w := range ws {
			if w.State == view.StateAdmitted && w.PrefillWeight != nil {
				n++
			}
		}
		return n == 2
	})
	hw, _ := byNode(ws, "gpu-h20")
	dw, _ := byNode(ws, "gpu-dp2")
	t.Logf("h20-like: decode %.1f tok/s (weight %.3f), prefill %.1f tok/s (weight %.3f)", *hw.Throughput, *hw.Weight, *hw.PrefillTPS, *hw.PrefillWeight)
	t.Logf("4090-dp2: decode %.1f tok/s (weight %.3f), prefill %.1f tok/s (weight %.3f)", *dw.Throughput, *dw.Weight, *dw.PrefillTPS, *dw.PrefillWeight)
	// The product's rule, whatever the machine's load made of the sims'
	// speeds: each weight is the worker's own throughput, decode or
	// prefill, over the median of the two (their mean), clamped, so the
	// two tables are weighed apart. That the calibrations rank the sims
	// apart (h20-like decodes faster, 4090-dp2 prefills faster) is a
	// wall-clock figure: under test-under-load the decode ranking came out
	// reversed (442.8 against 742.3 tok/s). make bench measures it (area 7).
	def := fleet.DefaultConfig()
	for _, k := range []struct {
		table            string
		h20, dp2         float64
		h20Want, dp2Want *float64
	}{
		{"decode", *hw.Throughput, *dw.Throughput, hw.Weight, dw.Weight},
		{"prefill", *hw.PrefillTPS, *dw.PrefillTPS, hw.PrefillWeight, dw.PrefillWeight},
	} {
		median := (k.h20 + k.dp2) / 2
		for _, x := range []struct {
			node   string
			tps    float64
			weight *float64
		}{{"gpu-h20", k.h20, k.h20Want}, {"gpu-dp2", k.dp2, k.dp2Want}} {
			want := min(max(x.tps/median, def.WeightMin), def.WeightMax)
			if x.weight == nil || math.Abs(*x.weight/want-1) > 1e-9 {
				t.Errorf("%s: %s weight %v, want %.6f (%.1f tok/s over the median %.1f)", x.node, k.table, x.weight, want, x.tps, median)
			}
		}
	}
	for _, w := range []view.Worker{hw, dw} {
		p := w.Measurement.Prefill
		if p == nil || p.PromptLength != 4096 || p.Requests != 4 || !p.Complete || p.TokenSource != "usage" {
			t.Errorf("%s: prefill part %+v", w.Node, p)
		}
		// vLLM's max_model_len and SGLang's context length, both within
		// their pools.
		if w.MaxContextTokens == nil || *w.MaxContextTokens != 40960 {
			t.Errorf("%s: max_context_tokens %v, want 40960", w.Node, w.MaxContextTokens)
		}
	}

	var table view.Weights
	if code := c.do(t, http.MethodGet, "/api/v1/models/"+model+"/weights?kind=prefill", "", nil, &table); code != http.StatusOK {
		t.Fatalf("prefill weights: HTTP %d", code)
	}
	if table.Kind != view.WeightPrefill || len(table.Workers) != 2 {
		t.Fatalf("prefill table %+v", table)
	}
	for _, e := range table.Workers {
		want := map[string]*float64{hw.ID: hw.PrefillWeight, dw.ID: dw.PrefillWeight}[e.ID]
		if want == nil || e.Weight != *want || e.MaxContextTokens == nil || e.Throughput == nil {
			t.Errorf("table entry %+v", e)
		}
	}

	// The prefill pin moves the prefill weight alone.
	var w view.Worker
	body := map[string]any{"weight": 2, "kind": "prefill"}
	if code := c.do(t, http.MethodPost, "/api/v1/workers/"+hw.ID+"/pin", adminToken, body, &w); code != http.StatusOK {
		t.Fatalf("prefill pin: HTTP %d", code)
	}
	if w.PrefillWeight == nil || *w.PrefillWeight != 2 || w.PinnedWeight != nil || *w.Weight != *hw.Weight {
		t.Errorf("after the prefill pin: prefill weight %v, weight %v (was %v), pinned %v", w.PrefillWeight, *w.Weight, *hw.Weight, w.PinnedWeight)
	}
}
