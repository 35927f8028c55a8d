package sim

import (
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
)

// Speculative decoding (SpecAccept 3): a request's first token comes
// alone, then each decode step gives it 3 tokens, streamed as one chunk
// (127 tokens after the first: 42 chunks of 3 and one of 1). A step takes
// three plain steps' time, so the tokens delivered per second are still
// the calibration. The generated counters count tokens; vLLM's inter-token
// histogram holds one interval per step, SGLang's one per token, the
// step's interval shared among them.
func TestSpeculativeDecoding(t *testing.T) {
	const s1, s16, tokens, accept = 200.0, 1600.0, 128, 3
	chunks := 1 + (tokens-1+accept-1)/accept
	for _, flavor := range []string{FlavorVLLM, FlavorSGLang} {
		t.Run(flavor, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := bubbleSim(t, Config{Flavor: flavor, SingleTPS: s1, Batch16TPS: s16, SpecAccept: accept})
				results, wall := burstStreams(t, s.URL(), 16, tokens, map[string]any{"stream_options": map[string]any{"include_usage": true}})
				for i, r := range results {
					if r.readErr != nil || !r.done || r.usage == nil || r.usage.CompletionTokens != tokens || r.tokens != chunks || len(r.text) != len(textOf(tokens)) {
						t.Fatalf("request %d: %d chunks, usage %+v, %d bytes of text; want %d chunks carrying %d tokens", i, r.tokens, r.usage, len(r.text), chunks, tokens)
					}
				}
				if got := float64(16*tokens) / wall.Seconds(); !exact(got, s16) {
					t.Errorf("throughput %v tok/s, want the calibration's %v", got, s16)
				}
				mfs := scrape(t, s.URL())
				prefix, perRequest := "vllm:", float64(chunks-1)
				if flavor == FlavorSGLang {
					prefix, perRequest = "sglang:", tokens-1
				}
				itl := mfs[prefix+"inter_token_latency_seconds"].GetMetric()[0].GetHistogram()
				gen := value(t, mfs, prefix+"generation_tokens_total", nil)
				if gen != 16*tokens || float64(itl.GetSampleCount()) != 16*perRequest {
					t.Errorf("generated %v (want %d), inter-token count %d (want %v)", gen, 16*tokens, itl.GetSampleCount(), 16*perRequest)
				}
				// The histogram's sum is each request's time from its first
				// token to its last, whichever way it counts: a step of
				// sixteen takes 16/s16 per token it gives.
				want := 16 * float64(tokens-1) * 16 / s16
				if got := itl.GetSampleSum(); !exact(got, want) {
					t.Errorf("inter-token sum %v s, want %v", got, want)
				}
			})
		})
	}
}

// textOf is the text of n tokens as the sim streams them.
func textOf(n int) string {
	s := ""
	for i := range n {
		s += piece(i)
	}
	return s
}

// Asked for continuous usage, vLLM and SGLang put the tokens made so far
// in every chunk, so a client counts a speculative step's tokens as they
// arrive (1, then 3 a step, then the last one). vLLM gives it only with
// include_usage, which both take as true when stream_options leaves it
// out; llama.cpp has no such option.
func TestContinuousUsage(t *testing.T) {
	const tokens = 8
	steps := []int{1, 4, 7, 8}
	for _, tc := range []struct {
		flavor string
		opts   map[string]any
		soFar  []int // nil: no usage in the chunks
		final  bool
	}{
		{FlavorVLLM, map[string]any{"include_usage": true, "continuous_usage_stats": true}, steps, true},
		{FlavorVLLM, map[string]any{"continuous_usage_stats": true}, steps, true},
		{FlavorVLLM, map[string]any{"include_usage": false, "continuous_usage_stats": true}, nil, false},
		{FlavorVLLM, map[string]any{"include_usage": true}, nil, true},
		{FlavorSGLang, map[string]any{"include_usage": false, "continuous_usage_stats": true}, steps, false},
		{FlavorSGLang, map[string]any{"continuous_usage_stats": true}, steps, true},
		{FlavorLlamaCpp, map[string]any{"include_usage": true, "continuous_usage_stats": true}, nil, true},
		{FlavorLlamaCpp, map[string]any{"continuous_usage_stats": true}, nil, false},
	} {
		t.Run(fmt.Sprintf("%s/%v", tc.flavor, tc.opts), func(t *testing.T) {
			t.Parallel()
			cfg := fast(tc.flavor)
			cfg.SpecAccept = 3
			s := startSim(t, cfg)
			r := streamChat(t, s.URL(), chatBody(tokens, map[string]any{"min_tokens": tokens, "ignore_eos": true, "n_predict": tokens, "stream_options": tc.opts}))
			want := tc.soFar
			if want == nil {
				want = []int{-1, -1, -1, -1}
			}
			if !slices.Equal(r.soFar, want) {
				t.Errorf("usage in the chunks %v, want %v", r.soFar, want)
			}
			if final := r.final != nil && r.final.CompletionTokens == tokens; final != tc.final || !r.done {
				t.Errorf("final usage %+v (want one: %v), done %v", r.final, tc.final, r.done)
			}
		})
	}
}
