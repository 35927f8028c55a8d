package enginelog_test

import (
	"fmt"
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

// A runner on Ollama's own engine (--ollama-engine) prints none of
// llama.cpp's context lines: its pool is the KV size Ollama starts it
// with, --ctx-size on the command line (to 2025) or KvSize in the load
// request it commits (2026, whose command line has none). The lines are
// in the form two public server logs show (testdata/engines/wild).
func TestOllamaRunnerContextSize(t *testing.T) {
	const (
		start2025 = `time=2025-07-24T18:29:07.517+09:00 level=INFO source=server.go:438 msg="starting llama server" cmd="/usr/bin/ollama runner --ollama-engine --model /m/sha256-e7 --ctx-size %d --batch-size 512 --n-gpu-layers 63 --parallel 2 --port 52512"`
		discovery = `time=2026-02-21T11:56:46.054-06:00 level=INFO source=server.go:431 msg="starting runner" cmd="/usr/local/bin/ollama runner --ollama-engine --port 36869"`
		start2026 = `time=2026-02-21T12:07:54.434-06:00 level=INFO source=server.go:431 msg="starting runner" cmd="/usr/local/bin/ollama runner --ollama-engine --model /m/sha256-cdc4 --port 43625"`
		load2026  = `time=2026-02-21T12:07:54.457-06:00 level=INFO source=runner.go:1284 msg=load request="{Operation:%s LoraPath:[] Parallel:1 BatchSize:512 FlashAttention:Enabled KvSize:%d KvCacheType: NumThreads:4 GPULayers:[] MultiUserCache:false ProjectorPath: MainGPU:0 UseMmap:false}"`
		cells     = `llama_kv_cache: size = 1024.00 MiB (  %d cells,  32 layers,  2/2 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB`
	)
	tests := map[string]struct {
		lines  []string
		want   int64
		format string
	}{
		"--ctx-size": {[]string{fmt.Sprintf(start2025, 8192)}, 8192, engine.FormatOllamaCtxSize},
		"the committed KvSize, after discovery runners": {[]string{discovery, discovery, start2026,
			fmt.Sprintf(load2026, "fit", 32768), fmt.Sprintf(load2026, "alloc", 16384), fmt.Sprintf(load2026, "commit", 16384)},
			16384, engine.FormatOllamaCtxSize},
		"a fit that came to nothing": {[]string{start2026, fmt.Sprintf(load2026, "fit", 32768)}, 0, ""},
		"llama.cpp's cells before the command line's size": {[]string{fmt.Sprintf(start2025, 8192), fmt.Sprintf(cells, 8000)},
			8000, engine.FormatLlamaKVCells},
		"a runner started again": {[]string{fmt.Sprintf(start2025, 8192), fmt.Sprintf(start2025, 4096)}, 4096, engine.FormatOllamaCtxSize},
	}
	for name, tc := range tests {
		f, err := enginelog.Read(gram(t, "ollama"), strings.NewReader(strings.Join(tc.lines, "\n")))
		if tc.want == 0 {
			if err == nil {
				t.Errorf("%s: ranks %v, want no pool", name, f.Ranks)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != tc.format {
			t.Errorf("%s: ranks %v format %q, want %d from %s", name, f.Ranks, f.Format, tc.want, tc.format)
		}
	}
}
