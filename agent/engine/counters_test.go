package engine

import (
	"bytes"
	"maps"
	"math"
	"strings"
	"testing"

	"heft/shared/testutil"
)

// The generated-tokens counter is read from the engines' own pages, per
// rank where the engine labels it.
func TestParseMetricsGenerated(t *testing.T) {
	tests := []struct {
		kind, file string
		known      bool
		total      float64
		ranks      map[int]float64
	}{
		{"vllm", "engines/vllm-dp2-metrics.txt", true, 10528 + 9308, map[int]float64{0: 10528, 1: 9308}},
		{"sglang", "engines/sglang-dp2-uneven-metrics.txt", true, 4117, map[int]float64{0: 4117}},
		{"llamacpp", "metrics/llamacpp.txt", true, 2048, map[int]float64{0: 2048}},
		{"vllm", "metrics/vllm-v0-old-names.txt", false, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			mf, err := ParseMetrics(tt.kind, bytes.NewReader(testutil.ReadTestdata(t, tt.file)))
			if err != nil {
				t.Fatal(err)
			}
			if mf.GeneratedKnown != tt.known || mf.Generated != tt.total || !maps.Equal(mf.GeneratedRanks, tt.ranks) {
				t.Errorf("generated = %v %v %v, want %v %v %v", mf.GeneratedKnown, mf.Generated, mf.GeneratedRanks, tt.known, tt.total, tt.ranks)
			}
		})
	}
}

// The inter-token latency histogram's sum and count are summed over the
// ranks (vLLM labels them by engine, SGLang's tokenizer keeps one), or
// llama.cpp's decode seconds over its generated tokens; a kind or page
// without them says so.
func TestParseMetricsInterToken(t *testing.T) {
	const vllmPage = `# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 10.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 20.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.3
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 20.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.01",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 10.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.2
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 10.0
`
	const sglangOld = `# HELP sglang:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE sglang:time_per_output_token_seconds histogram
sglang:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 4.0
sglang:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
sglang:time_per_output_token_seconds_sum{model_name="m"} 0.08
sglang:time_per_output_token_seconds_count{model_name="m"} 4.0
`
	// llama.cpp has no histogram; its finished requests' decode seconds
	// over their tokens are the same mean.
	llamaPage := string(testutil.ReadTestdata(t, "metrics/llamacpp.txt"))
	llamaNoSeconds := `# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 2048
`
	llamaNoTokens := `# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 31.77
`
	sglangNew := strings.NewReplacer("time_per_output_token", "inter_token_latency").Replace(sglangOld)
	// vLLM before 0.11 kept each token's interval under the older name.
	vllmOld := strings.NewReplacer("inter_token_latency", "time_per_output_token").Replace(vllmPage)
	// Only a histogram observed as tokens are sent, whose sum is time and
	// whose count is tokens, is live: older SGLang's counts chunks, and
	// llama.cpp's counters move when a request finishes.
	for _, tt := range []struct {
		kind, page  string
		known, live bool
		sum, n      float64
	}{
		{"vllm", vllmPage, true, true, 0.5, 30},
		{"vllm", vllmOld, true, true, 0.5, 30},
		{"vllm", vllmPage + strings.ReplaceAll(vllmOld, "0.", "9."), true, true, 0.5, 30}, // the new name wins
		{"sglang", sglangOld, true, false, 0.08, 4},
		{"sglang", sglangNew, true, true, 0.08, 4},
		{"sglang", vllmPage, false, false, 0, 0},
		{"llamacpp", llamaPage, true, false, 31.77, 2048},
		{"llamacpp", llamaNoSeconds, false, false, 0, 0},
		{"llamacpp", llamaNoTokens, false, false, 0, 0},
		{"vllm", llamaPage, false, false, 0, 0},
	} {
		mf, err := ParseMetrics(tt.kind, bytes.NewReader([]byte(tt.page)))
		if err != nil {
			t.Fatal(err)
		}
		if mf.InterTokenKnown != tt.known || mf.InterTokenLive != tt.live || math.Abs(mf.InterTokenSeconds-tt.sum) > 1e-12 || mf.InterTokens != tt.n {
			t.Errorf("%s: inter-token = %v (live %v) %v %v, want %v (live %v) %v %v", tt.kind, mf.InterTokenKnown, mf.InterTokenLive,
				mf.InterTokenSeconds, mf.InterTokens, tt.known, tt.live, tt.sum, tt.n)
		}
	}
}

// SGLang's tokenizer adds a request's tokens to generation_tokens_total
// only when the request finishes; the tokens it has sent are its
// inter-token histogram's count (one per token after a request's first,
// as each chunk is sent) and its time-to-first-token count (one per
// request). Without both histograms, or with only the older per-chunk
// mean, the counter is all there is.
func TestParseMetricsSGLangTokensSent(t *testing.T) {
	const finished = `# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 256.0
`
	const itl = `# TYPE sglang:inter_token_latency_seconds histogram
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 1270.0
sglang:inter_token_latency_seconds_sum{model_name="m"} 25.4
sglang:inter_token_latency_seconds_count{model_name="m"} 1270.0
`
	const ttft = `# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 10.0
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.5
sglang:time_to_first_token_seconds_count{model_name="m"} 10.0
`
	oldITL := strings.ReplaceAll(itl, "inter_token_latency", "time_per_output_token")
	for _, tt := range []struct {
		name, page string
		want       float64
	}{
		{"both histograms", finished + itl + ttft, 1280},
		{"both histograms, no request finished yet", itl + ttft, 1280},
		{"no time to first token", finished + itl, 256},
		{"older per-chunk mean", finished + oldITL + ttft, 256},
	} {
		mf, err := ParseMetrics("sglang", strings.NewReader(tt.page))
		if err != nil {
			t.Fatal(err)
		}
		if !mf.GeneratedKnown || mf.Generated != tt.want || mf.GeneratedRanks[0] != tt.want {
			t.Errorf("%s: generated = %v %v %v, want %v", tt.name, mf.GeneratedKnown, mf.Generated, mf.GeneratedRanks, tt.want)
		}
	}
	// vLLM counts its tokens as it makes them: its counter stands.
	mf, err := ParseMetrics("vllm", strings.NewReader(strings.ReplaceAll(finished+itl+ttft, "sglang:", "vllm:")))
	if err != nil {
		t.Fatal(err)
	}
	if mf.Generated != 256 || !mf.FirstTokensKnown || mf.FirstTokens != 10 {
		t.Errorf("vllm: generated = %v, first tokens %v %v; want its counter's 256 and 10 first tokens", mf.Generated, mf.FirstTokensKnown, mf.FirstTokens)
	}
}

// The prompt tokens an engine computed are its prompt counter over every
// rank less what its prefix cache served; a page without the counter says
// so.
func TestParseMetricsPrompt(t *testing.T) {
	const vllmCached = `# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 3000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 800.0
`
	const sglangCached = `# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 900.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m"} 300.0
`
	tests := []struct {
		name, kind string
		page       []byte
		known      bool
		computed   float64
	}{
		{"vllm dp2", "vllm", testutil.ReadTestdata(t, "engines/vllm-dp2-metrics.txt"), true, 4102 + 3590},
		{"vllm cache hits", "vllm", []byte(vllmCached), true, 8000 - 2000},
		{"sglang", "sglang", testutil.ReadTestdata(t, "engines/sglang-dp2-uneven-metrics.txt"), true, 6662},
		{"sglang cache hits", "sglang", []byte(sglangCached), true, 600},
		{"llamacpp", "llamacpp", testutil.ReadTestdata(t, "metrics/llamacpp.txt"), true, 18432},
		{"vllm v0", "vllm", testutil.ReadTestdata(t, "metrics/vllm-v0-old-names.txt"), true, 1024},
		{"no counter", "vllm", []byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n"), false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mf, err := ParseMetrics(tt.kind, bytes.NewReader(tt.page))
			if err != nil {
				t.Fatal(err)
			}
			if mf.PromptKnown != tt.known || mf.PromptComputed != tt.computed {
				t.Errorf("prompt = %v %v, want %v %v", mf.PromptKnown, mf.PromptComputed, tt.known, tt.computed)
			}
		})
	}
}
