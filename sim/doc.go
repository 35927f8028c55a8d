// Package sim is heft-sim, a simulated inference engine for tests,
// benchmarks and the demo. It speaks the HTTP surface of vLLM, SGLang,
// mlx-lm's server, llama.cpp's llama-server or Ollama and writes that
// engine's start-up log, so the agent can be exercised end to end without
// a GPU.
//
// The step model. Each data-parallel rank runs its own continuous-batching
// loop. A step has a budget of MaxBatchedTokens tokens (the flavour's
// max_num_batched_tokens, chunked_prefill_size, n_batch or num_batch).
// Each decoding sequence takes one token of it; the rest goes to prompt
// chunks of sequences still prefilling, oldest first. SGLang and mlx-lm
// keep prompt chunks in steps of their own, and decoding waits while a
// prompt is read (SGLang without --enable-mixed-chunk). A sequence whose
// last prompt chunk is in a step samples its first token in that step. A
// step that gives b sequences a token and prefills p prompt tokens takes
//
//	(t0 + k·b, when b > 0) + p/P seconds
//
// where t0 + k = 1/S1 and t0 + 16k = 16/S16 (SingleTPS, Batch16TPS) and P is
// PrefillTPS. So one request alone decodes at S1 tok/s, sixteen together
// at S16 tok/s in total per rank, and one long prompt of L tokens with one
// output token takes L/P + 1/S1 seconds, chunked or not. Valid calibrations
// have S1 ≤ S16 < 16·S1. Without PrefillTPS prefill is free: a prompt is
// whole when admitted and only decode steps cost time. Steps are paced by
// absolute wall-clock deadlines, so jitter does not slow the average pace;
// a step is fixed when it starts and requests that arrive meanwhile join
// the next one. An idle loop sleeps until work arrives. For the first
// ColdSeconds after start every step, prefill included, is ColdFactor
// times slower. capacity.go computes the true capacities a probe should
// measure (PrefillCapacity, DecodeCapacity) with this same planner.
//
// Memory. A rank's KV pool holds the computed prompt tokens and generated
// tokens of its running sequences (what the usage metrics show); a prompt
// fills it chunk by chunk as it is read. To admit a request the rank sets
// aside prompt + max tokens, so nothing is ever preempted; a request that
// does not fit waits in the rank's FIFO queue. Requests are dealt to ranks
// round-robin, whatever their sizes, like SGLang's round_robin. What a
// prompt longer than the context meets is each engine's own (limits.go):
// vLLM and SGLang answer 400 with their messages, SGLang also when the
// prompt does not fit the pool of the rank it was dealt to, llama.cpp
// answers exceed_context_size_error beyond a slot's n_ctx, Ollama cuts the
// prompt silently. vLLM's max_model_len is printed in its start-up log and
// must fit every pool, or the sim refuses to start, as vLLM does.
//
// Tokens. A whitespace-separated word of up to 8 bytes is one token, a
// longer one a token per 8 bytes; a chat prompt adds 4 template tokens per
// message and 2 after the last (tokens.go), so a client can build a prompt
// of exactly L tokens. Config.PromptTokens fixes every prompt's length
// instead. usage.prompt_tokens reports the prompt as the engine saw it,
// streamed (with stream_options.include_usage) and not; vLLM, SGLang and
// llama.cpp also have a /tokenize endpoint that counts the same way
// (tokenize.go).
//
// Prefix cache. Each rank caches computed prompt prefixes (prefix.go):
// vLLM in blocks of 16 tokens, the others per token, never the last token
// of a prompt. A repeated prompt is served from it and reads almost
// instantly; a prompt with a unique first word finds at most the 3 chat
// template tokens before it. vLLM and SGLang report the hit as
// usage.prompt_tokens_details.cached_tokens when ReportCachedTokens is set,
// llama.cpp as timings.cache_n; NoPrefixCache turns it off. The prompt
// counters of /metrics count at each engine's moment: vLLM when the first
// token comes, SGLang when the request ends, llama.cpp only the tokens it
// computed. So do the generated-token counters: vLLM's at each step,
// SGLang's (like llama.cpp's) when the request ends; SGLang's
// time-to-first-token and inter-token histograms count tokens as they go.
//
// Load gauges. vLLM's and llama.cpp's show running and waiting requests
// as they are. SGLang's scheduler writes its gauges only on a prefill batch
// (the requests already decoding, not the batch's own), every
// DecodeLogInterval decode steps (--decode-log-interval, 40) and, once
// idle, when IdleLogEvery (30 s) has passed since the last write, so they
// lag both ways; its /v1/loads reads the scheduler as it is. The
// StaleGaugesOnAbort fault makes vLLM's written when a step ends, as old
// vLLM's stats are: requests all aborted at once stay on them.
//
// Speculative decoding (Config.SpecAccept, --spec-accept N): each decode
// step gives a request N tokens, streamed as one chunk, and takes N plain
// steps' time. vLLM's inter-token histogram then holds one interval per
// step, SGLang's N observations of a share of it.
//
// Length. With ignore_eos, or min_tokens ≥ the max tokens, a response is
// exactly max tokens long (finish_reason "length"), in the fields each
// engine really reads; mlx and Ollama ignore both, as the real ones do.
// Otherwise it ends at a seeded pseudo-random natural length, uniform in
// [NaturalMin, NaturalMax) and at least min_tokens, with finish_reason
// "stop" unless the max tokens (default DefaultMaxTokens) or the end of
// the context cut it first.
//
// Faults (Config.Faults) make it lie or break on purpose: ignore the
// exact-length fields, over-report completion or prompt tokens, fail every
// Nth request, cut or garble streams, stay unready after start, truncate
// prompts silently, serve every prompt as if cached, reject prompts
// above a length with the flavour's context error, print other pools
// in the start-up log than the metrics serve, or keep aborted requests on
// vLLM's gauges.
//
// Meetings. A benchmark marks its load with the X-Heft-Load header
// (LoadHeader, its value a label such as the gateway); GET
// /heft-sim/meetings counts, per label, the load requests served and
// those in flight together with a request that carried no mark — on a
// benchmark's fleet, a heft probe's (meetings.go).
package sim
