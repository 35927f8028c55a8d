package enginelog_test

import (
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
)

// 2026 vLLM names the device in its pool line ("%s KV cache size: ..."):
// its CPU backend (vllm-openai-cpu v0.30.0) and vllm-metal print "CPU KV
// cache size", and the vllm-spyre plugin "Spyre KV cache size" without
// thousands separators. The first lines are as a public run report quotes
// the CPU build's log (testdata/engines/wild/vllm-0.30-cpu-grep-n-ready.log).
// A device line is a pool; a GPU line for the same rank is preferred to it.
func TestVLLMDeviceNamedPool(t *testing.T) {
	tests := map[string]struct {
		lines  []string
		want   int64
		format string
	}{
		"CPU backend, merged": {[]string{
			"(EngineCore pid=67) INFO 09-23 07:05:04 [kv_cache_utils.py:2395] CPU KV cache size: 21,760 tokens, Maximum concurrency for 2,048 tokens per request: 10.62x",
		}, 21760, engine.FormatVLLMDevice},
		"Spyre, two lines, no separators": {[]string{
			"(EngineCore_DP0 pid=9) INFO 05-02 10:00:00 [spyre_model_runner.py:800] Spyre KV cache size: 4096 tokens",
			"(EngineCore_DP0 pid=9) INFO 05-02 10:00:00 [spyre_model_runner.py:802] Maximum concurrency for 2048 tokens per request: 2.00x",
		}, 4096, engine.FormatVLLMDevice},
		"a GPU line beats a host figure beside it": {[]string{
			"(EngineCore_DP0 pid=9) INFO 05-02 10:00:00 [kv_cache_utils.py:2395] GPU KV cache size: 9,000 tokens, Maximum concurrency for 1,000 tokens per request: 9.00x",
			"(EngineCore_DP0 pid=9) INFO 05-02 10:00:00 [offload.py:10] CPU KV cache size: 90,000 tokens",
		}, 9000, engine.FormatVLLMMerged},
	}
	for name, tc := range tests {
		f, err := enginelog.Read(gram(t, "vllm"), strings.NewReader(strings.Join(tc.lines, "\n")))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != tc.format {
			t.Errorf("%s: ranks %v format %q, want %d tokens as %s", name, f.Ranks, f.Format, tc.want, tc.format)
		}
	}

	// Other words before "KV cache size" are not a device: skipped.
	for _, line := range []string{
		"INFO 05-02 10:00:00 [x.py:1] Total KV cache size: 5 tokens",
		"INFO 05-02 10:00:00 [x.py:1] CPU KV cache size: 5 blocks",
		"INFO 05-02 10:00:00 [x.py:1] Multiplying the GPU KV cache size by the cp_world_size 4 (pcp_world_size 1 * dcp_world_size 4).",
	} {
		if ev, ok := enginelog.ParseLine(gram(t, "vllm"), line); ok {
			t.Errorf("%q read as %+v", line, ev)
		}
	}
}
