package e2e

import (
	"net/http"
	"path/filepath"
	"testing"

	"heft/bench"
	"heft/shared/view"
)

// TestPrefillWeight runs real agents' probes, prefill burst included, of
// two sims whose decode and prefill rankings disagree (the bench's h20-like
// and 4090-dp2 calibrations): the coordinator gives the fast decoder the
// higher decode weight and the fast prefiller the higher prefill weight,
// serves both tables, and knows what each worker can hold.
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
	if !(*hw.Weight > *dw.Weight) || !(*hw.PrefillWeight < *dw.PrefillWeight) {
		t.Errorf("decode weights h20 %.3f, dp2 %.3f; prefill weights h20 %.3f, dp2 %.3f: the two should rank them apart",
			*hw.Weight, *dw.Weight, *hw.PrefillWeight, *dw.PrefillWeight)
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
