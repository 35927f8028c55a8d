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
// 59932672849 and 67663730134 of the code index). The second excerpt
// keeps no cache size line, so nothing says how many streams the full
// cache's cells are per: its context's n_ctx is the pool.
func TestLlamaCppSlidingWindowCache(t *testing.T) {
	tests := map[string]struct {
		lines  []string
		want   int64
		format string
	}{
		"two size lines": {[]string{
			"llama_kv_cache_iswa: creating non-SWA KV cache, size = 131072 cells",
			"llama_kv_cache:      Metal KV buffer size =  3072.00 MiB",
			"llama_kv_cache: size = 3072.00 MiB (131072 cells,  12 layers,  1/1 seqs), K (f16): 1536.00 MiB, V (f16): 1536.00 MiB",
			"llama_kv_cache_iswa: creating     SWA KV cache, size = 2304 cells",
			"llama_kv_cache:      Metal KV buffer size =    54.00 MiB",
			"llama_kv_cache: size =   54.00 MiB (  2304 cells,  12 layers,  1/1 seqs), K (f16):   27.00 MiB, V (f16):   27.00 MiB",
		}, 131072, engine.FormatLlamaISWABase},
		"time and level before each line, no size line": {[]string{
			"0.19.914.512 I llama_context: n_ctx         = 8192",
			"0.19.914.513 I llama_context: n_ctx_seq     = 8192",
			"0.19.914.972 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 8192 cells",
			"0.19.915.550 I llama_kv_cache:    Vulkan0 KV buffer size =   128.00 MiB",
			"0.19.990.788 I llama_kv_cache_iswa: creating     SWA KV cache, size = 6144 cells",
			"0.19.992.711 I llama_kv_cache:    Vulkan0 KV buffer size =  1920.00 MiB",
		}, 8192, engine.FormatLlamaNCtx},
	}
	for name, tc := range tests {
		for _, kind := range []string{"llamacpp", "ollama"} {
			f, err := enginelog.Read(gram(t, kind), strings.NewReader(strings.Join(tc.lines, "\n")))
			if err != nil {
				t.Fatalf("%s, %s: %v", name, kind, err)
			}
			if !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != tc.format {
				t.Errorf("%s, %s: ranks %v format %q, want %d from %s", name, kind, f.Ranks, f.Format, tc.want, tc.format)
			}
		}
	}
}

// A split cache (llama-server "-np N" without --kv-unified) keeps one
// stream per slot, and a sliding-window model's "creating non-SWA KV
// cache, size = N cells" names one stream's cells without saying how many
// streams there are. The full cache's size line that follows names N cells
// again with "A/S seqs", and the pool is N × S. Until such a line, the
// figure is unknown: the context's n_ctx is used if printed, and the
// window's smaller size line never is. The lines are real: a gemma-4-12B
// "-c 8192 -np 2" note (stored file 62861137369), a 2025 log of
// llama_kv_cache_unified_iswa's naming (file 65929508964, its section 4)
// and testdata/engines/wild/llamacpp-dsv4-iswa-2026.log.
func TestLlamaCppSplitSlidingWindowCache(t *testing.T) {
	const (
		base   = "llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells"
		baseSz = "llama_kv_cache: size =  128.00 MiB ( 4096 cells,  8 layers, 2/2 seqs), K (f16): 64.00 MiB, V (f16): 64.00 MiB"
		swa    = "llama_kv_cache_iswa: creating     SWA KV cache, size = 1536 cells"
		swaSz  = "llama_kv_cache: size =  960.00 MiB ( 1536 cells, 40 layers, 2/2 seqs), K (f16): 480.00 MiB, V (f16): 480.00 MiB"
		nCtx   = "llama_context: n_ctx         = 8192"
	)
	tests := map[string]struct {
		lines  []string
		want   int64 // 0: no pool
		format string
	}{
		"split, two slots":    {[]string{base, baseSz, swa, swaSz}, 8192, engine.FormatLlamaISWABase},
		"split, beside n_ctx": {[]string{nCtx, base, baseSz, swa, swaSz}, 8192, engine.FormatLlamaISWABase},
		"unified, four slots": {[]string{
			"llama_kv_cache_iswa: creating non-SWA KV cache, size = 393216 cells",
			"llama_kv_cache: size =    0.00 MiB (393216 cells,   0 layers,  4/1 seqs), K (f16):    0.00 MiB, V (f16):    0.00 MiB",
		}, 393216, engine.FormatLlamaISWABase},
		"2025 naming, one count of seqs per line": {[]string{
			"llama_kv_cache_unified_iswa: creating non-SWA KV cache, size = 4096 cells",
			"llama_kv_cache_unified:    Vulkan0 KV buffer size =    96.00 MiB",
			"llama_kv_cache_unified: size =   96.00 MiB (  4096 cells,  12 layers,  1/1 seqs), K (f16):   48.00 MiB, V (f16):   48.00 MiB",
			"llama_kv_cache_unified_iswa: creating     SWA KV cache, size = 640 cells",
			"llama_kv_cache_unified:    Vulkan0 KV buffer size =    15.00 MiB",
			"llama_kv_cache_unified: size =   15.00 MiB (   640 cells,  12 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB",
		}, 4096, engine.FormatLlamaISWABase},
		"full cache's size line not yet written": {[]string{nCtx, base}, 8192, engine.FormatLlamaNCtx},
		"nothing names the streams":              {[]string{base}, 0, ""},
		"only the window's size line":            {[]string{base, swa, swaSz}, 0, ""},
	}
	for name, tc := range tests {
		for _, kind := range []string{"llamacpp", "ollama"} {
			f, err := readLines(t, kind, tc.lines...)
			switch {
			case tc.want == 0 && (err == nil || len(f.Ranks) > 0):
				t.Errorf("%s (%s): ranks %v format %q, want no pool", name, kind, f.Ranks, f.Format)
			case tc.want != 0 && (err != nil || !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != tc.format):
				t.Errorf("%s (%s): ranks %v format %q err %v, want %d from %s", name, kind, f.Ranks, f.Format, err, tc.want, tc.format)
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
		cells     = `llama_kv_cache: size = 1024.00 MiB (  %d cells,  32 layers,  2/1 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB`
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
