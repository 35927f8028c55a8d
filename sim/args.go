package sim

import "math"

// Memory figures the logs and info endpoints print, for a Qwen3-8B-like
// model: 36 layers × 8 KV heads × 128 dims × K and V × 2 bytes per token.
const (
	kvBytesPerToken = 147456
	weightsGiB      = 15.28
	gib             = 1 << 30
	memFraction     = 0.85
	contextLen      = 40960
)

func kvGiB(tokens int64) float64 { return float64(tokens) * kvBytesPerToken / gib }

// sglangMem works SGLang's pool sizing backwards from a pool: the free
// memory before and after the weights that would have produced it.
func sglangMem(tokens int64) (preLoad, postLoad float64) {
	kv := kvGiB(tokens)
	preLoad = (kv + weightsGiB + 0.09) / memFraction
	postLoad = preLoad - weightsGiB - 0.09
	return preLoad, postLoad
}

// calibrationArgs are the sim's own knobs, logged beside the engine's
// launch arguments so that different calibrations read as different
// launches (and so as different capacity keys).
func (s *Server) calibrationArgs() []pyArg {
	c := s.cfg
	args := []pyArg{
		{"heft_sim_single_tps", c.SingleTPS},
		{"heft_sim_batch16_tps", c.Batch16TPS},
		{"heft_sim_kv_tokens", c.KVTokens},
	}
	if c.PrefillTPS > 0 {
		args = append(args, pyArg{"heft_sim_prefill_tps", c.PrefillTPS})
	}
	if c.ColdFactor > 1 {
		args = append(args, pyArg{"heft_sim_cold_factor", c.ColdFactor}, pyArg{"heft_sim_cold_seconds", c.ColdSeconds})
	}
	return args
}

// vllmArgs is what vLLM's "non-default args:" line prints.
func (s *Server) vllmArgs() []pyArg {
	c := s.cfg
	args := []pyArg{
		{"model_tag", c.Model}, {"host", s.host}, {"port", s.port}, {"model", c.Model},
		{"max_model_len", c.MaxModelLen},
	}
	if mn := s.multiNodeArgs(); mn != nil {
		args = append(args, mn...)
	} else if c.DP > 1 {
		args = append(args, pyArg{"data_parallel_size", c.DP})
	}
	if c.MaxRunning != defaultMaxRunning[FlavorVLLM] {
		args = append(args, pyArg{"max_num_seqs", c.MaxRunning})
	}
	if c.MaxBatchedTokens != defaultBatchedTokens[FlavorVLLM] {
		args = append(args, pyArg{"max_num_batched_tokens", c.MaxBatchedTokens})
	}
	if c.NoPrefixCache {
		args = append(args, pyArg{"enable_prefix_caching", false})
	}
	if c.ReportCachedTokens {
		args = append(args, pyArg{"enable_prompt_tokens_details", true})
	}
	return append(args, s.calibrationArgs()...)
}

// sglangArgs is (a subset of) SGLang's ServerArgs, in its field order.
func (s *Server) sglangArgs() []pyArg {
	c := s.cfg
	var maxRunning, contextLength any // None: the engine's own default
	if c.MaxRunning != defaultMaxRunning[FlavorSGLang] {
		maxRunning = c.MaxRunning
	}
	if c.MaxModelLen != contextLen {
		contextLength = c.MaxModelLen
	}
	args := []pyArg{
		{"model_path", c.Model}, {"tokenizer_path", c.Model}, {"tokenizer_mode", "auto"},
		{"skip_tokenizer_init", false}, {"load_format", "auto"}, {"trust_remote_code", false},
		{"dtype", "auto"}, {"kv_cache_dtype", "auto"}, {"quantization", nil}, {"context_length", contextLength},
		{"device", "cuda"}, {"served_model_name", c.Model}, {"chat_template", nil},
		{"is_embedding", false}, {"revision", nil}, {"host", s.host}, {"port", s.port},
		{"mem_fraction_static", memFraction}, {"max_running_requests", maxRunning}, {"max_total_tokens", nil},
		{"chunked_prefill_size", c.MaxBatchedTokens}, {"max_prefill_tokens", 16384}, {"schedule_policy", "fcfs"},
		{"schedule_conservativeness", 1.0}, {"tp_size", 1}, {"pp_size", 1}, {"stream_interval", 1},
		{"random_seed", c.Seed}, {"log_level", "info"}, {"enable_metrics", true},
		{"decode_log_interval", c.DecodeLogInterval}, {"api_key", nil}, {"dp_size", c.DP},
		{"load_balance_method", "round_robin"}, {"ep_size", 1}, {"enable_dp_attention", c.LogNaming == NamingDPAttention},
		{"disable_radix_cache", c.NoPrefixCache}, {"enable_cache_report", c.ReportCachedTokens},
		{"disable_cuda_graph", false}, {"cuda_graph_max_bs", 24},
	}
	return append(args, s.calibrationArgs()...)
}

// jsonArgs turns repr arguments into JSON values (None → null).
func jsonArgs(args []pyArg) map[string]any {
	m := make(map[string]any, len(args))
	for _, a := range args {
		v := a.val
		if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
			v = nil
		}
		m[a.key] = v
	}
	return m
}

// sglangRouterWorkerArgs are router worker i's ServerArgs: a server of its
// own (DP 1) on its own port.
func (s *Server) sglangRouterWorkerArgs(i int) []pyArg {
	args := s.sglangArgs()
	for j := range args {
		switch args[j].key {
		case "dp_size":
			args[j].val = 1
		case "port":
			args[j].val = s.port + 1 + i
		}
	}
	return args
}
