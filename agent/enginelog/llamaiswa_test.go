package enginelog_test

import (
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
)

// A model with sliding-window layers (gemma 3, gpt-oss) gets two caches
// in llama.cpp: the full one holds the context, the sliding-window one a
// window per sequence. Its pool is the full cache, never the smaller of
// the two "N cells" lines; newer builds put the time and a level before
// each line. The lines are as two public logs printed them (stored files
// 59932672849 and 67663730134 of the code index).
func TestLlamaCppSlidingWindowCache(t *testing.T) {
	tests := map[string]struct {
		lines []string
		want  int64
	}{
		"two size lines": {[]string{
			"llama_kv_cache_iswa: creating non-SWA KV cache, size = 131072 cells",
			"llama_kv_cache:      Metal KV buffer size =  3072.00 MiB",
			"llama_kv_cache: size = 3072.00 MiB (131072 cells,  12 layers,  1/1 seqs), K (f16): 1536.00 MiB, V (f16): 1536.00 MiB",
			"llama_kv_cache_iswa: creating     SWA KV cache, size = 2304 cells",
			"llama_kv_cache:      Metal KV buffer size =    54.00 MiB",
			"llama_kv_cache: size =   54.00 MiB (  2304 cells,  12 layers,  1/1 seqs), K (f16):   27.00 MiB, V (f16):   27.00 MiB",
		}, 131072},
		"time and level before each line": {[]string{
			"0.19.914.513 I llama_context: n_ctx_seq     = 8192",
			"0.19.914.972 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 8192 cells",
			"0.19.915.550 I llama_kv_cache:    Vulkan0 KV buffer size =   128.00 MiB",
			"0.19.990.788 I llama_kv_cache_iswa: creating     SWA KV cache, size = 6144 cells",
			"0.19.992.711 I llama_kv_cache:    Vulkan0 KV buffer size =  1920.00 MiB",
		}, 8192},
	}
	for name, tc := range tests {
		for _, kind := range []string{"llamacpp", "ollama"} {
			f, err := enginelog.Read(gram(t, kind), strings.NewReader(strings.Join(tc.lines, "\n")))
			if err != nil {
				t.Fatalf("%s, %s: %v", name, kind, err)
			}
			if !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != engine.FormatLlamaISWABase {
				t.Errorf("%s, %s: ranks %v format %q, want %d cells from the full cache", name, kind, f.Ranks, f.Format, tc.want)
			}
		}
	}
}
