package engine

import (
	"context"
	"strings"

	"heft/shared/wire"
)

// vLLM (reference/engines.md §1): its own /version, and load per
// data-parallel rank in /metrics (label engine="k"). Its KV pools are
// only in the start-up log: cache_config_info's num_gpu_blocks is the sum
// over DP ranks.
var vllm = descriptor{
	name:     wire.EngineVLLM,
	port:     8000,
	programs: []string{"vllm"},
	health:   "/health",
	metrics: &metricNames{
		rankLabel: "engine",
		running:   []string{"vllm:num_requests_running"},
		waiting:   []string{"vllm:num_requests_waiting"},
		kvUsage:   []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		generated: []string{"vllm:generation_tokens_total"},
		// vLLM 0.11 renamed time_per_output_token_seconds, deprecating the
		// old name; a request's mean has its own name since
		// (request_time_per_output_token_seconds). Before, the old name
		// held what the new one does, each token's interval as it is made
		// (IterationStats.time_per_output_tokens_iter), so it is read
		// where the new name is missing.
		interToken: []string{"vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"},
		firstToken: []string{"vllm:time_to_first_token_seconds"},
		prompt:     []string{"vllm:prompt_tokens_total"},
		// Before 0.10, V1 counted its prefix cache's hits as
		// gpu_prefix_cache_hits only: in blocks in 0.8 (its HELP says
		// so), in tokens after. 0.10 added prefix_cache_hits and kept the
		// old name beside it until 0.12; only one is read.
		cached:    []string{"vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"},
		cacheInfo: "vllm:cache_config_info",
	},
	output: OutputForm{Exact: true, ContinuousUsage: true, Fields: func(n int) map[string]any {
		return map[string]any{"min_tokens": n, "ignore_eos": true}
	}},
	prefill: OutputForm{Exact: true, Fields: func(n int) map[string]any {
		return map[string]any{"min_tokens": n, "ignore_eos": true}
	}},
	// POST /tokenize with messages applies the chat template: its count is
	// what usage.prompt_tokens says for the same request.
	tokenize: &Tokenizer{Path: "/tokenize", Chat: true, Count: countField, Body: func(model, text string) map[string]any {
		return map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": text}},
			"add_generation_prompt": true}
	}},
	context: contextSource{models: true, args: []string{"max_model_len"}},
	detect:  detection{ownedBy: "vllm", probes: []probe{{"/version", []string{"version"}}}},
	running: vllmRunning,
	adapter: vllmAdapter{},
	log:     &vllmLog,
}

// vllmRunning reads --max-num-seqs, per data-parallel rank (each rank is
// an engine core with its own scheduler). Without it vLLM's OpenAI server
// takes 1024 on GPUs of 70 GiB or more that are not A100s, else 256
// (engine/arg_utils.py, get_batch_defaults).
func vllmRunning(in runningInput) (int, string) {
	if n, src, ok := positiveArg(in.args, "max_num_seqs"); ok {
		return n, src
	}
	if len(in.gpus) == 0 {
		return 256, runningFromDefault + " 256 (1024 on GPUs of 70 GiB or more; the engine's GPUs are unknown)"
	}
	for _, g := range in.gpus {
		if g.MemoryTotal < 70<<30 || strings.Contains(strings.ToLower(g.Name), "a100") {
			return 256, runningFromDefault + " 256"
		}
	}
	return 1024, runningFromDefault + " 1024 (GPUs of 70 GiB or more)"
}

type vllmAdapter struct{}

func (vllmAdapter) read(ctx context.Context, c *Client, r *reading) {
	v, err := c.version(ctx, "/version")
	r.note(err)
	r.version = v
	if r.down {
		return
	}
	mf, err := c.scrape(ctx)
	r.note(err)
	r.load = mf.Load
}

func (vllmAdapter) load(ctx context.Context, c *Client) (wire.Load, error) {
	mf, err := c.scrape(ctx)
	if err != nil {
		return wire.Load{}, err
	}
	return mf.LoadOf()
}
