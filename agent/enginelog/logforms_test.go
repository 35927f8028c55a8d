package enginelog_test

import (
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
)

// readLines reads lines joined as one log with the grammar of kind.
func readLines(t *testing.T, kind string, lines ...string) (enginelog.Facts, error) {
	t.Helper()
	return enginelog.Read(gram(t, kind), strings.NewReader(strings.Join(lines, "\n")))
}

// From 2025 llama.cpp's cache size line ends "N/S seqs": S is the streams
// it keeps, one for a unified cache and one per slot for a split one, and
// its cells are one stream's. Ollama 2026 starts llama-server with
// "-np N", which splits the cache. The lines are as public logs print them
// (testdata/engines/wild/llamacpp-2026-np4-split-cells-metal.log,
// ollama-0.33-llama-server-runner-np2-split-cells.log).
func TestLlamaCppSplitCacheStreams(t *testing.T) {
	tests := map[string]struct {
		lines []string
		want  int64
	}{
		"four slots, split": {[]string{
			"llama_kv_cache: size = 1024.00 MiB (  2048 cells,  32 layers,  4/4 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB",
		}, 8192},
		"two slots, split, beside the context's n_ctx": {[]string{
			"llama_context: n_ctx                 = 8192",
			"llama_context: n_ctx_seq             = 4096",
			"llama_kv_cache: size =  832.00 MiB (  4096 cells,  26 layers,  2/2 seqs), K (f16):  416.00 MiB, V (f16):  416.00 MiB",
		}, 8192},
		"four slots, unified": {[]string{
			"0.02.017.917 I llama_kv_cache: size =  476.00 MiB ( 16384 cells,  28 layers,  4/1 seqs), K (q8_0):  238.00 MiB, V (q8_0):  238.00 MiB",
		}, 16384},
		"before streams, one count of seqs": {[]string{
			"llama_kv_cache_unified: size = 1120.00 MiB (  8192 cells,  28 layers,  2 seqs), K (f16):  560.00 MiB, V (f16):  560.00 MiB",
		}, 8192},
	}
	for name, tc := range tests {
		for _, kind := range []string{"llamacpp", "ollama"} {
			f, err := readLines(t, kind, tc.lines...)
			if err != nil || !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != engine.FormatLlamaKVCells {
				t.Errorf("%s (%s): ranks %v format %q err %v, want %d cells", name, kind, f.Ranks, f.Format, err, tc.want)
			}
		}
	}
	if _, ok := enginelog.ParseLine(gram(t, "llamacpp"), "llama_kv_cache: size = 1.00 MiB (  2048 cells,  32 layers,  4/0 seqs), K (f16): 1 MiB"); ok {
		t.Errorf("a cache of no streams read as a pool")
	}
}

// Two wrappers with letters come before llama.cpp lines in the wild: a
// journal exported to a file (read inside another wrapper, or without
// one) and docker compose's service column. Lines as ollama/ollama#9362
// and #3988 show them.
func TestLlamaCppWrapperPrefixes(t *testing.T) {
	for name, line := range map[string]string{
		"journald":                "Feb 27 11:23:59 iZbp1d0j83sijy1mh3b3s9Z ollama[26115]: llama_new_context_with_model: n_ctx         = 8192",
		"compose, indented":       "                    ollama-2  | llama_new_context_with_model: n_ctx      = 8192",
		"compose, then time":      "llama-1  | 0.02.011.942 I llama_context: n_ctx         = 8192",
		"journald, a 2026 runner": "Aug 27 23:56:52 brice-X870E-Taichi ollama[1502099]: llama_context: n_ctx                 = 8192",
	} {
		f, err := readLines(t, "ollama", line)
		if err != nil || !slices.Equal(f.Ranks, ranks(0, 8192)) {
			t.Errorf("%s: ranks %v err %v, want 8192", name, f.Ranks, err)
		}
	}
	for name, line := range map[string]string{
		"an identifier without a pid": "Feb 27 11:23:59 host ollama: llama_context: n_ctx         = 8192",
		"a column inside a message":   `0.13.750.219 I srv  log_server_r: request: {"prompt":"x  | llama_context: n_ctx         = 8192"}`,
		"a table row":                 "| llama_context: n_ctx         = 8192 |",
	} {
		if ev, ok := enginelog.ParseLine(gram(t, "llamacpp"), line); ok {
			t.Errorf("%s: read as %+v", name, ev)
		}
	}
}

// Early 2025 vLLM V1 (VLLM_USE_V1=1, to v0.7.3) printed its pool as "#
// GPU blocks: N" with no CPU blocks after it; V0's CPU backend printed "#
// CPU blocks: N", its pool, the same way. The pool is N × the block size.
// Lines as vllm-project/vllm#12569 and #13596 show them.
func TestVLLMBlocksAlone(t *testing.T) {
	for name, tc := range map[string]struct {
		lines []string
		want  int64
	}{
		"V1, early 2025": {[]string{
			"INFO 02-20 00:01:02 kv_cache_utils.py:522] # GPU blocks: 127626",
			"INFO 02-20 00:01:02 kv_cache_utils.py:525] Maximum concurrency for 2048 tokens per request: 997.08x",
		}, 2042016},
		"V0 CPU backend": {[]string{"INFO 11-20 06:33:10 cpu_executor.py:214] # CPU blocks: 2730"}, 43680},
		"V0, with swap":  {[]string{"INFO 02-18 08:50:24 executor_base.py:108] # cuda blocks: 1478, # CPU blocks: 2048"}, 23648},
	} {
		f, err := readLines(t, "vllm", tc.lines...)
		if err != nil || !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != engine.FormatVLLMBlocks {
			t.Errorf("%s: ranks %v format %q err %v, want %d", name, f.Ranks, f.Format, err, tc.want)
		}
	}
	for _, line := range []string{
		"INFO 02-20 00:01:02 kv_cache_utils.py:522] # GPU blocks: 127626 (after the profile)",
		"INFO 02-20 00:01:02 kv_cache_utils.py:522] # GPU blocks: 12x",
	} {
		if ev, ok := enginelog.ParseLine(gram(t, "vllm"), line); ok {
			t.Errorf("%q read as %+v", line, ev)
		}
	}
}

// From 2026 Ollama runs llama.cpp's llama-server as its runner, started
// with "starting llama-server" and "-c N" (the context over all -np
// slots). Each load is a new start-up: a model loaded again with a larger
// context must not keep the smaller pool of the load before it. Lines as
// a public note quotes Ollama 0.32.13's journal (file id 61880559644 of
// the code index; testdata/engines/wild/ollama-0.32-journald-llama-server-kv-block.log).
func TestOllamaLlamaServerRunner(t *testing.T) {
	const (
		spawn   = `Aug 27 23:56:36 brice-X870E-Taichi ollama[1502099]: time=2026-08-27T23:56:36.676-05:00 level=INFO source=llama_server.go:431 msg="starting llama-server" cmd="/usr/local/lib/ollama/llama-server --model /mnt/extra/…/sha256-bc286970… --port 45739 --host 127.0.0.1 --no-webui --offline -c %s -np 1 --log-verbosity 4 --no-log-prefix --no-log-timestamps --no-jinja --chat-template chatml --load-mode none --flash-attn auto -b 512 -ub 512"`
		cells   = `Aug 27 23:56:37 brice-X870E-Taichi ollama[1502099]: llama_kv_cache: size =  540.00 MiB (  %s cells,  27 layers,  1/1 seqs), K (f16):  324.00 MiB, V (f16):  216.00 MiB`
		started = `time=2026-09-02T16:53:11.045Z level=INFO source=llama_server.go:1362 msg="llama-server started in 36.45 seconds"`
	)
	line := func(format, n string) string { return strings.Replace(format, "%s", n, 1) }
	f, err := readLines(t, "ollama", line(spawn, "2048"), line(cells, "2048"), line(spawn, "8192"), line(cells, "8192"))
	if err != nil || !slices.Equal(f.Ranks, ranks(0, 8192)) || f.Restarts != 1 {
		t.Errorf("a model loaded again: ranks %v restarts %d err %v, want 8192 after one restart", f.Ranks, f.Restarts, err)
	}
	f, err = readLines(t, "ollama", line(spawn, "4096"), started)
	if err != nil || !slices.Equal(f.Ranks, ranks(0, 4096)) || f.Format != engine.FormatOllamaCtxSize || !f.Ready {
		t.Errorf("the spawn line alone: ranks %v format %q ready %v err %v, want its -c 4096, ready", f.Ranks, f.Format, f.Ready, err)
	}
}
