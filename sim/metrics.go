package sim

import (
	"net/http"
	"strconv"
)

const vllmBlockSize = 16

func writeMetrics(w http.ResponseWriter, p *promText) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(p.b.String()))
}

// handleVLLMMetrics serves vLLM V1's names and labels: engine="<dp rank>"
// and model_name on every series but cache_config_info.
func (s *Server) handleVLLMMetrics(w http.ResponseWriter, _ *http.Request) {
	views := s.views()
	p := &promText{format: promFloat}
	lbl := func(v rankView, extra ...promLabel) []promLabel {
		return append([]promLabel{{"engine", strconv.Itoa(v.idx)}, {"model_name", s.cfg.Model}}, extra...)
	}
	gauge := func(name, help string, val func(rankView) float64) {
		p.family(name, help, "gauge")
		for _, v := range views {
			p.sample(name, lbl(v), val(v))
		}
	}
	counter := func(base, help string, val func(rankView) float64) {
		p.family(base+"_total", help, "counter")
		for _, v := range views {
			p.sample(base+"_total", lbl(v), val(v))
		}
		p.family(base+"_created", help, "gauge")
		for _, v := range views {
			p.sample(base+"_created", lbl(v), float64(s.start.UnixMilli())/1000)
		}
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func(v rankView) float64 { return float64(v.gauges.running) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func(v rankView) float64 { return float64(v.gauges.waiting) })
	p.family("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.", "gauge")
	for _, v := range views {
		p.sample("vllm:engine_sleep_state", lbl(v, promLabel{"sleep_state", "awake"}), 1)
		p.sample("vllm:engine_sleep_state", lbl(v, promLabel{"sleep_state", "weights_offloaded"}), 0)
		p.sample("vllm:engine_sleep_state", lbl(v, promLabel{"sleep_state", "discard_all"}), 0)
	}
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
		func(v rankView) float64 { return float64(v.gauges.used) / float64(v.pool) })
	p.family("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", "counter")
	for _, v := range views {
		p.sample("vllm:num_preemptions_total", lbl(v), 0)
	}
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
		func(v rankView) float64 { return float64(v.stats.promptFirst) })
	counter("vllm:generation_tokens", "Number of generation tokens processed.",
		func(v rankView) float64 { return float64(v.stats.genTokens) })
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
		func(v rankView) float64 { return float64(v.stats.cacheQueries) })
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
		func(v rankView) float64 { return float64(v.stats.cacheHits) })
	p.family("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "histogram")
	for _, v := range views {
		p.histogram("vllm:time_to_first_token_seconds", lbl(v), v.stats.ttft)
	}
	p.family("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "histogram")
	for _, v := range views {
		p.histogram("vllm:inter_token_latency_seconds", lbl(v), v.stats.itl)
	}
	p.family("vllm:request_success_total", "Count of successfully processed requests.", "counter")
	for _, v := range views {
		for _, reason := range []string{"stop", "length", "abort"} {
			p.sample("vllm:request_success_total", lbl(v, promLabel{"finished_reason", reason}), float64(v.stats.finished[reason]))
		}
	}
	// The front end sums num_gpu_blocks over all DP ranks and puts the sum
	// on every engine's series: per-rank pools are only in the log.
	var blocks int64
	for _, v := range views {
		blocks += v.pool / vllmBlockSize
	}
	p.family("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
	for _, v := range views {
		p.sample("vllm:cache_config_info", []promLabel{
			{"block_size", strconv.Itoa(vllmBlockSize)}, {"cache_dtype", "auto"}, {"calculate_kv_scales", "False"},
			{"cpu_offload_gb", "0"}, {"enable_prefix_caching", pyRepr(!s.cfg.NoPrefixCache)}, {"engine", strconv.Itoa(v.idx)},
			{"gpu_memory_utilization", "0.9"}, {"is_attention_free", "False"}, {"kv_cache_memory_bytes", "None"},
			{"num_cpu_blocks", "None"}, {"num_gpu_blocks", strconv.FormatInt(blocks, 10)},
			{"num_gpu_blocks_override", "None"}, {"prefix_caching_hash_algo", "sha256"},
			{"sliding_window", "None"}, {"swap_space", "4"},
		}, 1)
	}
	writeMetrics(w, p)
}

// handleSGLangMetrics serves SGLang's scheduler gauges (dp_rank label only
// when DP > 1), as its scheduler last wrote them, and tokenizer counters
// (model_name only), which move as each chunk is sent or request ends.
func (s *Server) handleSGLangMetrics(w http.ResponseWriter, _ *http.Request) {
	views := s.views()
	p := &promText{format: promFloat}
	lbl := func(v rankView) []promLabel {
		l := []promLabel{{"engine_type", "unified"}, {"model_name", s.cfg.Model},
			{"moe_ep_rank", "0"}, {"pp_rank", "0"}, {"tp_rank", "0"}}
		if len(views) > 1 {
			l = append(l, promLabel{"dp_rank", strconv.Itoa(v.idx)})
		}
		return l
	}
	perRank := func(name, help, typ string, val func(rankView) float64) {
		p.family(name, help, typ)
		for _, v := range views {
			p.sample(name, lbl(v), val(v))
		}
	}
	perRank("sglang:num_running_reqs", "The number of running requests.", "gauge",
		func(v rankView) float64 { return float64(v.gauges.running) })
	perRank("sglang:num_used_tokens", "The number of used tokens.", "gauge",
		func(v rankView) float64 { return float64(v.gauges.used) })
	perRank("sglang:token_usage", "The token usage.", "gauge",
		func(v rankView) float64 { return float64(v.gauges.used) / float64(v.pool) })
	perRank("sglang:gen_throughput", "The generation throughput (token/s).", "gauge",
		func(v rankView) float64 { return v.gauges.throughput })
	perRank("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "gauge",
		func(v rankView) float64 { return float64(v.gauges.waiting) })
	perRank("sglang:cache_hit_rate", "The prefix cache hit rate.", "gauge", hitRate)
	perRank("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", "gauge",
		func(v rankView) float64 { return float64(v.pool) })
	perRank("sglang:num_retracted_requests_total", "Total number of retracted requests.", "counter",
		func(rankView) float64 { return 0 })

	var prompt, cached, gen, done int64
	var itl itlHist
	ttft := itlHist{bounds: ttftBuckets}
	for _, v := range views {
		itl.add(v.stats.itl)
		ttft.add(v.stats.ttft)
		prompt += v.stats.promptFinished
		cached += v.stats.cachedFinished
		gen += v.stats.genFinished
		done += v.stats.finished["stop"] + v.stats.finished["length"] + v.stats.finished["abort"]
	}
	model := []promLabel{{"model_name", s.cfg.Model}}
	p.family("sglang:prompt_tokens_total", "Number of prefill tokens processed.", "counter")
	p.sample("sglang:prompt_tokens_total", model, float64(prompt))
	p.family("sglang:cached_tokens_total", "Number of cached prompt tokens.", "counter")
	p.sample("sglang:cached_tokens_total", model, float64(cached))
	p.family("sglang:generation_tokens_total", "Number of generation tokens processed.", "counter")
	p.sample("sglang:generation_tokens_total", model, float64(gen))
	p.family("sglang:num_requests_total", "Number of requests processed.", "counter")
	p.sample("sglang:num_requests_total", model, float64(done))
	// The tokenizer keeps it, over every rank.
	p.family("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "histogram")
	p.histogram("sglang:inter_token_latency_seconds", model, itl)
	p.family("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "histogram")
	p.histogram("sglang:time_to_first_token_seconds", model, ttft)
	writeMetrics(w, p)
}

// handleLlamaMetrics serves llama-server's unlabelled series.
func (s *Server) handleLlamaMetrics(w http.ResponseWriter, _ *http.Request) {
	v := s.ranks[0].view()
	p := &promText{format: func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }}
	one := func(name, help, typ string, val float64) {
		p.family("llamacpp:"+name, help, typ)
		p.sample("llamacpp:"+name, nil, val)
	}
	busyPerDecode := 0.0
	if v.stats.steps > 0 {
		busyPerDecode = float64(v.stats.busySlots) / float64(v.stats.steps)
	}
	promptTPS := 0.0
	if v.stats.prefillSeconds > 0 {
		promptTPS = float64(v.stats.promptComputed) / v.stats.prefillSeconds
	}
	one("prompt_tokens_total", "Number of prompt tokens processed.", "counter", float64(v.stats.promptComputed))
	one("prompt_seconds_total", "Prompt process time", "counter", v.stats.prefillSeconds)
	// llama-server adds a request's tokens and decode time when it finishes.
	one("tokens_predicted_total", "Number of generation tokens processed.", "counter", float64(v.stats.predicted))
	one("tokens_predicted_seconds_total", "Predict process time", "counter", v.stats.predictedSeconds)
	one("n_decode_total", "Total number of llama_decode() calls", "counter", float64(v.stats.steps))
	one("n_tokens_max", "Largest observed n_tokens.", "counter", float64(v.stats.maxBatchTok))
	one("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", "counter", busyPerDecode)
	one("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", "gauge", promptTPS)
	one("predicted_tokens_seconds", "Average generation throughput in tokens/s.", "gauge", v.stats.throughput)
	one("requests_processing", "Number of requests processing.", "gauge", float64(v.running))
	one("requests_deferred", "Number of requests deferred.", "gauge", float64(v.waiting))
	writeMetrics(w, p)
}

// hitRate is the share of looked-up prompt tokens the prefix cache served.
func hitRate(v rankView) float64 {
	if v.stats.cacheQueries == 0 {
		return 0
	}
	return float64(v.stats.cacheHits) / float64(v.stats.cacheQueries)
}
