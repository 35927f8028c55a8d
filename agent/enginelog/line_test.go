package enginelog_test

import (
	"maps"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
)

func TestParseLine(t *testing.T) {
	pool := func(dp, tp int, format string, tokens int64) enginelog.Event {
		return enginelog.Event{Kind: enginelog.EventPool, DPRank: dp, TPRank: tp, Format: format, KVTokens: tokens}
	}
	merged := pool(0, -1, engine.FormatVLLMMerged, 379088)
	merged.MaxModelLen, merged.Concurrency = 40960, 9.26
	tests := []struct {
		name, kind, line string
		want             enginelog.Event
		ok               bool
	}{
		// vLLM pools, prefixes and headers.
		{"v1 two-line DP1", "vllm", "(EngineCore_DP1 pid=2412131) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 686,320 tokens",
			pool(1, -1, engine.FormatVLLMTwoLine, 686320), true},
		{"v1 merged, EngineCore is rank 0", "vllm", "(EngineCore pid=187) INFO 03-02 10:00:38 [kv_cache_utils.py:2485] GPU KV cache size: 379,088 tokens, Maximum concurrency for 40,960 tokens per request: 9.26x",
			merged, true},
		{"no prefix at all", "vllm", "INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 1,000 tokens",
			pool(0, -1, engine.FormatVLLMTwoLine, 1000), true},
		{"worker prefix gives DP and TP", "vllm", "(Worker_DP3_PP0_TP1 pid=9) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 2,048 tokens",
			pool(3, 1, engine.FormatVLLMTwoLine, 2048), true},
		{"worker without DP is rank 0", "vllm", "(Worker_TP1 pid=9) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 64 tokens",
			pool(0, 1, engine.FormatVLLMTwoLine, 64), true},
		{"ANSI colours everywhere", "vllm", "\x1b[1;36m(EngineCore_DP2 pid=5)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m12-11 00:06:53\x1b[0m [kv_cache_utils.py:1286] GPU KV cache size: \x1b[1m5,120\x1b[0m tokens",
			pool(2, -1, engine.FormatVLLMTwoLine, 5120), true},
		{"VLLM_LOGGING_PREFIX before the level", "vllm", "(EngineCore_DP1 pid=5) node-a| INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 7 tokens",
			pool(1, -1, engine.FormatVLLMTwoLine, 7), true},
		{"debug-level relative path", "vllm", "DEBUG 12-11 00:06:53 [v1/core/kv_cache_utils.py:1286] GPU KV cache size: 8 tokens",
			pool(0, -1, engine.FormatVLLMTwoLine, 8), true},
		{"V0 old header, GPU blocks", "vllm", "INFO 02-18 08:50:24 gpu_executor.py:102] # GPU blocks: 27305, # CPU blocks: 2048",
			enginelog.Event{Kind: enginelog.EventPool, TPRank: -1, Format: engine.FormatVLLMBlocks, Blocks: 27305}, true},
		{"V0 cuda blocks", "vllm", "INFO 02-18 08:50:24 [executor_base.py:113] # cuda blocks: 2570, # CPU blocks: 2048",
			enginelog.Event{Kind: enginelog.EventPool, TPRank: -1, Format: engine.FormatVLLMBlocks, Blocks: 2570}, true},
		{"Ray worker prefix", "vllm", "(RayWorkerWrapper pid=3, ip=10.0.0.2) INFO 02-18 08:50:24 executor_base.py:108] # cuda blocks: 10, # CPU blocks: 2",
			enginelog.Event{Kind: enginelog.EventPool, TPRank: -1, Format: engine.FormatVLLMBlocks, Blocks: 10}, true},
		{"tqdm segment then a pool line inherits the prefix", "vllm", "(EngineCore_DP1 pid=9) Capturing CUDA graphs: 100%|█████| 51/51\rINFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 1,000 tokens\r",
			pool(1, -1, engine.FormatVLLMTwoLine, 1000), true},
		{"concurrency alone", "vllm", "(EngineCore_DP0 pid=1) INFO 12-11 09:14:37 [kv_cache_utils.py:1291] Maximum concurrency for 40,960 tokens per request: 9.12x",
			enginelog.Event{Kind: enginelog.EventConcurrency, TPRank: -1, MaxModelLen: 40960, Concurrency: 9.12}, true},
		{"V0 concurrency without separators", "vllm", "INFO 07-15 09:30:16 [executor_base.py:118] Maximum concurrency for 32768 tokens per request: 2.51x",
			enginelog.Event{Kind: enginelog.EventConcurrency, TPRank: -1, MaxModelLen: 32768, Concurrency: 2.51}, true},

		// vLLM version, ready, engine init.
		{"API server version", "vllm", "(APIServer pid=1) INFO 12-11 09:13:58 [api_server.py:1839] vLLM API server version 0.12.0",
			enginelog.Event{Kind: enginelog.EventVersion, TPRank: -1, Version: "0.12.0"}, true},
		{"server version and model", "vllm", "(APIServer pid=1) INFO 03-02 10:00:01 [utils.py:61] vLLM server version 0.28.0, serving model Qwen/Qwen3-8B",
			enginelog.Event{Kind: enginelog.EventVersion, TPRank: -1, Version: "0.28.0", Model: "Qwen/Qwen3-8B"}, true},
		{"engine init", "vllm", "(EngineCore_DP1 pid=213) INFO 12-11 09:14:14 [core.py:93] Initializing a V1 LLM engine (v0.12.0) with config: model='Qwen/Qwen3-8B', served_model_name=qwen, seed=0",
			enginelog.Event{Kind: enginelog.EventEngineInit, DPRank: 1, TPRank: -1, Version: "0.12.0", Model: "qwen"}, true},
		{"ready, newest", "vllm", "(APIServer pid=1) INFO 03-02 10:00:50 [api_server.py:689] Starting vLLM server on http://0.0.0.0:8000",
			enginelog.Event{Kind: enginelog.EventReady, TPRank: -1}, true},
		{"ready, 2025", "vllm", "(APIServer pid=1) INFO 12-11 09:14:50 [api_server.py:1941] Starting vLLM API server 0 on http://0.0.0.0:8000",
			enginelog.Event{Kind: enginelog.EventReady, TPRank: -1}, true},
		{"ready, uvicorn", "vllm", "(APIServer pid=1) INFO:     Application startup complete.",
			enginelog.Event{Kind: enginelog.EventReady, TPRank: -1}, true},
		// 2026's version banner is a logo (vllm-project/vllm#53743, pasted
		// with each line's CR as a literal "^M").
		{"version logo, CR pasted as ^M", "vllm", "(APIServer pid=133844) INFO 08-29 02:16:04 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.1.dev20175+g2573878a3.d20260821^M",
			enginelog.Event{Kind: enginelog.EventVersion, TPRank: -1, Version: "0.1.dev20175+g2573878a3.d20260821"}, true},
		{"version logo, CRLF", "vllm", "(APIServer pid=1) INFO 08-29 02:16:04 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.14.0\r\n",
			enginelog.Event{Kind: enginelog.EventVersion, TPRank: -1, Version: "0.14.0"}, true},
		{"logo's model line", "vllm", "(APIServer pid=1) INFO 08-29 02:16:04 [api_utils.py:347]   █▄█▀ █     █     █     █  model   /workspace/models/Qwen3-30B-A3B",
			enginelog.Event{}, false},
		{"a message quoting the logo", "vllm", "(APIServer pid=1) INFO 08-29 02:16:04 [x.py:1] user said █  version 9.9.9",
			enginelog.Event{}, false},

		// vLLM lines that must be skipped.
		{"pool text without a header", "vllm", "GPU KV cache size: 5 tokens", enginelog.Event{}, false},
		{"pool text inside another message", "vllm", "INFO 12-11 00:06:53 [x.py:1] note: GPU KV cache size: 5 tokens", enginelog.Event{}, false},
		{"cut mid-number", "vllm", "INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 373,", enginelog.Event{}, false},
		{"overflowing number", "vllm", "INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 99999999999999999999 tokens", enginelog.Event{}, false},
		{"absurd rank", "vllm", "(EngineCore_DP99999999999999999999 pid=1) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 5 tokens", enginelog.Event{}, false},
		{"uvicorn other line", "vllm", "(APIServer pid=1) INFO:     Started server process [1]", enginelog.Event{}, false},
		{"blank", "vllm", "  \r", enginelog.Event{}, false},
		{"an SGLang line", "vllm", "[2025-07-14 09:02:27 DP0] KV Cache is allocated. #tokens: 24094, K size: 1.65 GB, V size: 1.65 GB", enginelog.Event{}, false},

		// SGLang.
		{"MHA", "sglang", "[2025-07-14 09:02:27 DP1] KV Cache is allocated. #tokens: 24037, K size: 1.65 GB, V size: 1.65 GB",
			pool(1, -1, engine.FormatSGLangAlloc, 24037), true},
		{"MLA", "sglang", "[2026-02-10 14:04:03 TP5] KV Cache is allocated. #tokens: 2454421, KV size: 160.63 GB",
			pool(0, 5, engine.FormatSGLangAlloc, 2454421), true},
		{"2026 names the dtype first", "sglang", "[2026-07-01 15:19:55 TP10] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 387968, K size: 5.92 GB, V size: 5.92 GB",
			pool(0, 10, engine.FormatSGLangAlloc, 387968), true},
		{"dtype, cut mid-number", "sglang", "[2026-07-01 15:19:55 DP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 3879", enginelog.Event{}, false},
		{"dtype, no count", "sglang", "[2026-07-01 15:19:55 DP0] KV Cache is allocated. dtype: torch.bfloat16, K size: 5.92 GB", enginelog.Event{}, false},
		{"max total, milliseconds, tokens out of order", "sglang", "[2026-03-02 10:15:21.123 TP1 PP0 DP3 EP1] max_total_num_tokens=24094, chunked_prefill_size=2048, max_prefill_tokens=16384",
			pool(3, 1, engine.FormatSGLangMaxTotal, 24094), true},
		{"MOE_DP and ATTN_CP are not DP", "sglang", "[2026-03-02 10:15:21 ATTN_CP1 MOE_DP1 TP0] max_total_num_tokens=10, max_prefill_tokens=1",
			pool(0, 0, engine.FormatSGLangMaxTotal, 10), true},
		{"ANSI and CRLF", "sglang", "\x1b[32m[2026-03-02 10:15:21 DP1]\x1b[0m max_total_num_tokens=10, max_prefill_tokens=1\r\n",
			pool(1, -1, engine.FormatSGLangMaxTotal, 10), true},
		{"ready", "sglang", "[2025-07-14 09:02:34] The server is fired up and ready to roll!", enginelog.Event{Kind: enginelog.EventReady, TPRank: -1}, true},
		{"uvicorn is not SGLang's ready", "sglang", "[2025-07-14 09:02:32] INFO:     Application startup complete.", enginelog.Event{}, false},
		{"cut mid-number", "sglang", "[2025-07-14 09:02:27 DP0] KV Cache is allocated. #tokens: 240", enginelog.Event{}, false},
		{"max total cut", "sglang", "[2025-07-14 09:02:27 DP0] max_total_num_tokens=240", enginelog.Event{}, false},
		{"no header", "sglang", "KV Cache is allocated. #tokens: 24037, K size: 1.65 GB, V size: 1.65 GB", enginelog.Event{}, false},
		{"no year", "sglang", "[07-14 09:02:27 DP0] max_total_num_tokens=1, x=2", enginelog.Event{}, false},
		{"a vLLM line", "sglang", "(EngineCore_DP1 pid=1) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 686,320 tokens", enginelog.Event{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.kind+"/"+tc.name, func(t *testing.T) {
			got, ok := enginelog.ParseLine(gram(t, tc.kind), tc.line)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v (event %+v)", ok, tc.ok, got)
			}
			if !ok {
				return
			}
			if !eventEqual(got, tc.want) {
				t.Errorf("event\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func eventEqual(a, b enginelog.Event) bool {
	return a.Kind == b.Kind && a.DPRank == b.DPRank && a.TPRank == b.TPRank && a.Format == b.Format &&
		a.KVTokens == b.KVTokens && a.Blocks == b.Blocks && a.MaxModelLen == b.MaxModelLen &&
		a.Concurrency == b.Concurrency && a.Version == b.Version && a.Model == b.Model &&
		a.ArgsErr == b.ArgsErr && maps.Equal(a.Args, b.Args)
}

func TestParseLineLaunchArgs(t *testing.T) {
	ev, ok := enginelog.ParseLine(gram(t, "vllm"), `(APIServer pid=1) INFO 03-02 10:00:01 [utils.py:67] non-default args: {'model_tag': 'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', 'served_model_name': ['qwen', 'q'], 'api_key': '***', 'quote': "it's", 'esc': 'a\tb\\c', 'cfg': {'a': (1,), 'b': None}, 'neg': -1.5e-3, 'on': True}`)
	if !ok || ev.Kind != enginelog.EventLaunchArgs || ev.ArgsErr != "" {
		t.Fatalf("event %+v ok %v", ev, ok)
	}
	want := map[string]string{"model_tag": "Qwen/Qwen3-8B", "model": "Qwen/Qwen3-8B", "served_model_name": "['qwen', 'q']",
		"api_key": "***", "quote": "it's", "esc": "a\tb\\c", "cfg": "{'a': (1,), 'b': None}", "neg": "-1.5e-3", "on": "True"}
	if !maps.Equal(ev.Args, want) {
		t.Errorf("args\n got %v\nwant %v", ev.Args, want)
	}
	if ev.Model != "qwen" {
		t.Errorf("model = %q, want the first served name", ev.Model)
	}

	// A line cut short keeps what was read and says why.
	ev, ok = enginelog.ParseLine(gram(t, "sglang"), `[2025-07-14 09:02:11] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', dp_size=2, tokenizer_mode='au`)
	if !ok || ev.Kind != enginelog.EventLaunchArgs || ev.ArgsErr == "" {
		t.Fatalf("event %+v ok %v", ev, ok)
	}
	if !maps.Equal(ev.Args, map[string]string{"model_path": "Qwen/Qwen3-8B", "dp_size": "2"}) || ev.Model != "Qwen/Qwen3-8B" {
		t.Errorf("partial args %v model %q", ev.Args, ev.Model)
	}

	// served_model_name=None falls back to model_path.
	ev, _ = enginelog.ParseLine(gram(t, "sglang"), `[2025-07-14 09:02:11] server_args=ServerArgs(served_model_name=None, model_path='/models/x', enum=<LoadFormat.AUTO: 'auto'>, dev=device(type='cuda', index=0))`)
	if ev.Model != "/models/x" || ev.Args["enum"] != "<LoadFormat.AUTO: 'auto'>" || ev.Args["dev"] != "device(type='cuda', index=0)" || ev.ArgsErr != "" {
		t.Errorf("event %+v", ev)
	}
}
