package sim

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// holdOne keeps one long request running on the sim until the test ends,
// or until its 2,000 tokens are out: the sim must be slow enough for the
// test's reads to come first.
func holdOne(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	first := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := post(ctx, s.URL(), chatBody(2000, map[string]any{"ignore_eos": true, "stream": true}))
		if err == nil {
			readStream(resp, func(n int) {
				if n == 1 {
					close(first)
				}
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-first: // running, and its prompt counted
	case <-done:
		t.Fatal("the held request ended before its first token")
	}
}

func labelNames(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestVLLMMetrics(t *testing.T) {
	t.Parallel()
	s := startSim(t, Config{SingleTPS: 200, Batch16TPS: 1600, DP: 2, KVTokens: []int64{24094, 2925}, PromptTokens: 100})
	holdOne(t, s) // lands on engine 0
	mfs := scrape(t, s.URL())

	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:generation_tokens_total", "vllm:prompt_tokens_total"} {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) != 2 {
			t.Fatalf("%s: want one series per engine, got %v", name, mf)
		}
		for i, m := range mf.GetMetric() {
			l := labelsOf(m)
			if got := labelNames(l); !slices.Equal(got, []string{"engine", "model_name"}) || l["model_name"] != DefaultModel {
				t.Errorf("%s series %d labels %v", name, i, l)
			}
		}
	}
	if got := value(t, mfs, "vllm:num_requests_running", map[string]string{"engine": "0"}); got != 1 {
		t.Errorf("running on engine 0 = %v, want 1", got)
	}
	if got := value(t, mfs, "vllm:num_requests_running", map[string]string{"engine": "1"}); got != 0 {
		t.Errorf("running on engine 1 = %v, want 0", got)
	}
	if u := value(t, mfs, "vllm:kv_cache_usage_perc", map[string]string{"engine": "0"}); u < 100.0/24094 || u > 1 {
		t.Errorf("kv usage on engine 0 = %v, want the prompt and more of 24094 as a 0-1 fraction", u)
	}
	if got := value(t, mfs, "vllm:prompt_tokens_total", map[string]string{"engine": "0"}); got != 100 {
		t.Errorf("prompt tokens %v, want 100", got)
	}
	for _, reason := range []string{"stop", "length", "abort"} {
		value(t, mfs, "vllm:request_success_total", map[string]string{"engine": "1", "finished_reason": reason})
	}
	// num_gpu_blocks is the sum over ranks on every engine's series.
	info := mfs["vllm:cache_config_info"]
	if info == nil || len(info.GetMetric()) != 2 {
		t.Fatalf("cache_config_info: %v", info)
	}
	for _, m := range info.GetMetric() {
		l := labelsOf(m)
		if l["num_gpu_blocks"] != "1687" || l["block_size"] != "16" {
			t.Errorf("cache_config_info{engine=%s} num_gpu_blocks=%s block_size=%s, want 1687 (1505+182), 16", l["engine"], l["num_gpu_blocks"], l["block_size"])
		}
		if _, ok := l["model_name"]; ok {
			t.Errorf("cache_config_info has a model_name label")
		}
	}
}

func TestSGLangMetrics(t *testing.T) {
	t.Parallel()
	for _, dp := range []int{1, 2} {
		t.Run(strings.Repeat("dp", dp), func(t *testing.T) {
			t.Parallel()
			pools := []int64{24094, 2925}[:dp]
			// At 200 tok/s holdOne's request runs for 10 s: a loaded machine
			// scrapes well before it ends (at 20,000 it ended within 0.1 s,
			// and a scrape under load once saw it finished).
			s := startSim(t, Config{Flavor: FlavorSGLang, SingleTPS: 200, Batch16TPS: 1600, DP: dp, KVTokens: pools})
			for range 3 {
				chat(t, s.URL(), chatBody(7, map[string]any{"min_tokens": 7}))
			}
			mfs := scrape(t, s.URL())
			want := []string{"engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}
			if dp > 1 {
				want = []string{"dp_rank", "engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank"}
			}
			for _, name := range []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
				"sglang:token_usage", "sglang:gen_throughput", "sglang:max_total_num_tokens"} {
				mf := mfs[name]
				if mf == nil || len(mf.GetMetric()) != dp {
					t.Fatalf("%s: want %d series, got %v", name, dp, mf)
				}
				for _, m := range mf.GetMetric() {
					l := labelsOf(m)
					if got := labelNames(l); !slices.Equal(got, want) || l["engine_type"] != "unified" {
						t.Errorf("%s labels %v, want names %v", name, l, want)
					}
				}
			}
			for i, pool := range pools {
				sel := map[string]string{}
				if dp > 1 {
					sel["dp_rank"] = string(rune('0' + i))
				}
				if got := value(t, mfs, "sglang:max_total_num_tokens", sel); got != float64(pool) {
					t.Errorf("max_total_num_tokens%v = %v, want %d", sel, got, pool)
				}
			}
			gen := mfs["sglang:generation_tokens_total"]
			if gen == nil || len(gen.GetMetric()) != 1 || !slices.Equal(labelNames(labelsOf(gen.GetMetric()[0])), []string{"model_name"}) {
				t.Fatalf("generation_tokens_total: %v", gen)
			}
			if got := gen.GetMetric()[0].GetCounter().GetValue(); got != 21 {
				t.Errorf("generation_tokens_total %v, want 21", got)
			}
			// The tokenizer counts a request's tokens when it finishes; its
			// histograms count them as they are sent: one first token per
			// request, the rest between tokens.
			holdOne(t, s)
			mfs = scrape(t, s.URL())
			ttft := mfs["sglang:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleCount()
			itl := mfs["sglang:inter_token_latency_seconds"].GetMetric()[0].GetHistogram().GetSampleCount()
			if got := value(t, mfs, "sglang:generation_tokens_total", nil); got != 21 || ttft != 4 || itl < 18 {
				t.Errorf("with one request running: generation_tokens_total %v (want 21, the finished ones'), "+
					"time to first token count %d (want 4), inter-token count %d (want 18 and the running one's)", got, ttft, itl)
			}
		})
	}
}

func TestLlamaCppMetrics(t *testing.T) {
	t.Parallel()
	s := startSim(t, Config{Flavor: FlavorLlamaCpp, SingleTPS: 200, Batch16TPS: 1600})
	chat(t, s.URL(), chatBody(3, map[string]any{"ignore_eos": true}))
	holdOne(t, s)
	mfs := scrape(t, s.URL())
	for _, name := range []string{"llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:tokens_predicted_total"} {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) != 1 || len(mf.GetMetric()[0].GetLabel()) != 0 {
			t.Fatalf("%s: want one unlabelled series, got %v", name, mf)
		}
	}
	if got := value(t, mfs, "llamacpp:requests_processing", nil); got != 1 {
		t.Errorf("requests_processing %v, want 1", got)
	}
	if got := value(t, mfs, "llamacpp:tokens_predicted_total", nil); got < 3 {
		t.Errorf("tokens_predicted_total %v, want at least 3", got)
	}
}

func TestNoMetrics(t *testing.T) {
	t.Parallel()
	for _, flavor := range []string{FlavorMLX, FlavorOllama} {
		s := startSim(t, fast(flavor))
		if code, _ := getBody(t, s.URL()+"/metrics"); code != http.StatusNotFound {
			t.Errorf("%s /metrics: %d, want 404", flavor, code)
		}
	}
}

func TestFlavorEndpoints(t *testing.T) {
	t.Parallel()
	t.Run("vllm", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, fast(FlavorVLLM))
		var v struct{ Version string }
		getJSON(t, s.URL()+"/version", &v)
		if v.Version != "0.12.0" {
			t.Errorf("version %q", v.Version)
		}
		var models struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int64  `json:"max_model_len"`
			} `json:"data"`
		}
		getJSON(t, s.URL()+"/v1/models", &models)
		if len(models.Data) != 1 || models.Data[0].ID != DefaultModel || models.Data[0].MaxModelLen != 40960 {
			t.Errorf("models %+v", models)
		}
		if code, _ := getBody(t, s.URL()+"/health"); code != 200 {
			t.Errorf("health %d", code)
		}
	})
	t.Run("sglang", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, Config{Flavor: FlavorSGLang, SingleTPS: 100, Batch16TPS: 800, DP: 2, KVTokens: []int64{24094, 2925}})
		var info struct {
			DPSize            int    `json:"dp_size"`
			MaxTotalNumTokens int64  `json:"max_total_num_tokens"`
			Version           string `json:"version"`
			ModelPath         string `json:"model_path"`
			InternalStates    []struct {
				MemoryUsage struct {
					TokenCapacity int64 `json:"token_capacity"`
				} `json:"memory_usage"`
			} `json:"internal_states"`
		}
		getJSON(t, s.URL()+"/server_info", &info)
		if info.DPSize != 2 || info.MaxTotalNumTokens != 24094 || info.Version == "" || info.ModelPath != DefaultModel ||
			len(info.InternalStates) != 2 || info.InternalStates[1].MemoryUsage.TokenCapacity != 2925 {
			t.Errorf("server_info %+v", info)
		}
		type load struct {
			DPRank            int   `json:"dp_rank"`
			NumRunningReqs    int   `json:"num_running_reqs"`
			NumWaitingReqs    int   `json:"num_waiting_reqs"`
			MaxTotalNumTokens int64 `json:"max_total_num_tokens"`
		}
		var loads struct{ Loads []load }
		getJSON(t, s.URL()+"/v1/loads", &loads)
		if len(loads.Loads) != 2 || loads.Loads[1] != (load{DPRank: 1, MaxTotalNumTokens: 2925}) {
			t.Errorf("loads %+v", loads)
		}
		getJSON(t, s.URL()+"/v1/loads?dp_rank=1", &loads)
		if len(loads.Loads) != 1 || loads.Loads[0].DPRank != 1 {
			t.Errorf("loads for dp_rank=1: %+v", loads)
		}
		if code, _ := getBody(t, s.URL()+"/v1/loads?dp_rank=5"); code != http.StatusBadRequest {
			t.Errorf("loads for a missing rank: %d", code)
		}
		var mi struct {
			ModelPath string `json:"model_path"`
		}
		getJSON(t, s.URL()+"/get_model_info", &mi)
		if mi.ModelPath != DefaultModel {
			t.Errorf("model info %+v", mi)
		}
	})
	t.Run("llamacpp", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, Config{Flavor: FlavorLlamaCpp, SingleTPS: 100, Batch16TPS: 800, KVTokens: []int64{65536}})
		var props struct {
			DefaultGenerationSettings struct {
				NCtx int64 `json:"n_ctx"`
			} `json:"default_generation_settings"`
			TotalSlots int `json:"total_slots"`
		}
		getJSON(t, s.URL()+"/props", &props)
		if props.DefaultGenerationSettings.NCtx != 4096 || props.TotalSlots != 16 {
			t.Errorf("props %+v, want n_ctx 4096 per slot, 16 slots", props)
		}
		var slots []struct {
			ID     int   `json:"id"`
			NCtx   int64 `json:"n_ctx"`
			IsProc bool  `json:"is_processing"`
		}
		getJSON(t, s.URL()+"/slots", &slots)
		if len(slots) != 16 || slots[15].ID != 15 || slots[0].NCtx != 4096 {
			t.Errorf("slots %+v", slots)
		}
		var h struct{ Status string }
		getJSON(t, s.URL()+"/health", &h)
		if h.Status != "ok" {
			t.Errorf("health %+v", h)
		}
		// A prompt as long as one slot's context is refused.
		if code, _, raw := chat(t, s.URL(), longChat(4096, "", 5)); code != 400 || !strings.Contains(raw, "exceed_context_size_error") {
			t.Errorf("oversized prompt: %d %s", code, raw)
		}
	})
	t.Run("ollama", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, Config{Flavor: FlavorOllama, Model: "qwen3:8b", SingleTPS: 100, Batch16TPS: 800, KVTokens: []int64{8192}})
		var v struct{ Version string }
		getJSON(t, s.URL()+"/api/version", &v)
		if v.Version != "0.13.0" {
			t.Errorf("version %q", v.Version)
		}
		var ps struct {
			Models []struct {
				Name          string `json:"name"`
				ContextLength int64  `json:"context_length"`
				SizeVRAM      int64  `json:"size_vram"`
			}
		}
		getJSON(t, s.URL()+"/api/ps", &ps)
		if len(ps.Models) != 1 || ps.Models[0].Name != "qwen3:8b" || ps.Models[0].ContextLength != 8192 || ps.Models[0].SizeVRAM <= 0 {
			t.Errorf("ps %+v", ps)
		}
		var tags struct{ Models []struct{ Name string } }
		getJSON(t, s.URL()+"/api/tags", &tags)
		if len(tags.Models) != 1 || tags.Models[0].Name != "qwen3:8b" {
			t.Errorf("tags %+v", tags)
		}
		if code, b := getBody(t, s.URL()+"/"); code != 200 || string(b) != "Ollama is running" {
			t.Errorf("root: %d %q", code, b)
		}
	})
	t.Run("mlx", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, fast(FlavorMLX))
		var h struct{ Status string }
		getJSON(t, s.URL()+"/health", &h)
		if h.Status != "ok" {
			t.Errorf("health %+v", h)
		}
		if code, _ := getBody(t, s.URL()+"/server_info"); code != http.StatusNotFound {
			t.Errorf("mlx /server_info: %d, want 404", code)
		}
	})
}
