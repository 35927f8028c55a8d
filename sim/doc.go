// Package sim is heft-sim, a simulated inference engine for tests,
// benchmarks and the demo. It speaks the HTTP surface of vLLM, SGLang,
// mlx-lm's server, llama.cpp's llama-server or Ollama and writes that
// engine's start-up log, so the agent can be exercised end to end without
// a GPU.
//
// The model. Each data-parallel rank runs its own continuous-batching
// loop. One decode step over a batch of b running sequences takes
// t0 + k·b seconds and gives each of them one token, where
// t0 + k = 1/S1 and t0 + 16k = 16/S16: one request alone decodes at
// SingleTPS (S1) tok/s and sixteen together at Batch16TPS (S16) tok/s in
// total, per rank. Valid calibrations have S1 ≤ S16 < 16·S1. Steps are
// paced by absolute wall-clock deadlines, so jitter does not slow the
// average pace; the batch is fixed when a step starts and requests that
// arrive meanwhile join the next step. An idle loop sleeps until work
// arrives. Prefill is free: only decode steps cost time. For the first
// ColdSeconds after start every step is ColdFactor times slower.
//
// Memory. A rank's KV pool holds the prompt and generated tokens of its
// running sequences (what the usage metrics show). To admit a request the
// rank sets aside prompt + max tokens, so nothing is ever preempted; a
// request that does not fit waits in the rank's FIFO queue, and one that
// could never fit (more than the pool, vLLM's max_model_len, or a
// llama.cpp slot's n_ctx) is refused with HTTP 400. Requests are dealt to
// ranks round-robin, whatever their sizes, like SGLang's round_robin.
// A prompt costs Config.PromptTokens if set, else ceil(1.3 × words) + 4
// per message + 2.
//
// Length. With ignore_eos, or min_tokens ≥ the max tokens, a response is
// exactly max tokens long (finish_reason "length"), in the fields each
// engine really reads; mlx and Ollama ignore both, as the real ones do.
// Otherwise it ends at a seeded pseudo-random natural length, uniform in
// [NaturalMin, NaturalMax) and at least min_tokens, with finish_reason
// "stop" unless the max tokens (default DefaultMaxTokens) cut it first.
//
// Faults (Config.Faults) make it lie or break on purpose: ignore the
// exact-length fields, over-report usage, fail every Nth request, cut or
// garble streams, or stay unready after start.
package sim
