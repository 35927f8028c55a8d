package enginelog_test

import (
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
)

// From 2026 llama-server prints neither its context's n_ctx nor the KV
// cache's cells at the default verbosity (they need -lv 4): its slots
// line is all a default log says of the pool. With a unified cache the
// slots share n_ctx_slot tokens; without one each holds its own. Its
// ready lines are "llama_server: model loaded" and a "listening on" line
// without "- starting the main loop". The lines are as public notes
// quote builds 10240 and 10298 (testdata/engines/wild/llamacpp-b10*).
func TestLlamaCppSlotsLine(t *testing.T) {
	tests := map[string]struct {
		lines  []string
		want   int64
		format string
		ready  bool
	}{
		"default verbosity, unified": {[]string{
			"0.00.172.118 I srv    load_model: loading model '../../models/Qwen2.5-7B-Instruct-Q4_K_M.gguf'",
			"0.09.390.156 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 16384, kv_unified = 'true'",
			"0.09.409.230 I srv  llama_server: model loaded",
		}, 16384, engine.FormatLlamaSlots, true},
		"split among six slots": {[]string{
			"0.10.095.546 W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 9216",
			"0.10.511.014 I srv    load_model: initializing, n_slots = 6, n_ctx_slot = 1536, kv_unified = 'false'",
		}, 9216, engine.FormatLlamaSlots, false},
		"listening on, 2026": {[]string{
			"0.01.658.804 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'true'",
			"0.01.661.327 I srv  llama_server: listening on http://127.0.0.1:8080",
		}, 8192, engine.FormatLlamaSlots, true},
		"the cache's cells are preferred": {[]string{
			"0.02.011.942 I llama_context: n_ctx         = 16384",
			"0.02.017.917 I llama_kv_cache: size =  476.00 MiB ( 16384 cells,  28 layers,  4/1 seqs), K (q8_0):  238.00 MiB, V (q8_0):  238.00 MiB",
			"0.02.087.061 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 4096, kv_unified = 'true'",
		}, 16384, engine.FormatLlamaKVCells, false},
	}
	for name, tc := range tests {
		f, err := enginelog.Read(gram(t, "llamacpp"), strings.NewReader(strings.Join(tc.lines, "\n")))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(f.Ranks, ranks(0, tc.want)) || f.Format != tc.format || f.Ready != tc.ready {
			t.Errorf("%s: ranks %v format %q ready %v, want %d as %s, ready %v", name, f.Ranks, f.Format, f.Ready, tc.want, tc.format, tc.ready)
		}
	}

	// A router's own listening line is not a model server's readiness.
	for _, line := range []string{
		"0.00.100.000 I srv  llama_server: router server is listening on http://127.0.0.1:8080",
		"main: loading model",
	} {
		if ev, ok := enginelog.ParseLine(gram(t, "llamacpp"), line); ok {
			t.Errorf("%q read as %+v", line, ev)
		}
	}
}

// llama.cpp's lines carry no prefix of their own to search for, so what
// comes before a message is taken off only when it is digits, spaces and
// date or time punctuation (a wrapper heft does not know, such as the
// "2026-05-14 22:14:31.035 | " of testdata/engines/wild/llamacpp-2026-mtp-pipe-timestamps.log),
// then the level llama-server's --log-prefix prints, with or without its
// time. A message inside another (a logged request body) is not a line;
// a router's "[port] " child lines are another server's and stay unread.
func TestLlamaCppLinePrefixes(t *testing.T) {
	read := func(lines ...string) (enginelog.Facts, error) {
		return enginelog.Read(gram(t, "llamacpp"), strings.NewReader(strings.Join(lines, "\n")))
	}
	for name, lines := range map[string][]string{
		"date, time and a bar": {
			"2026-05-14 22:14:30.967 | llama_context: n_ctx         = 131072",
			"2026-05-14 22:14:31.035 | llama_kv_cache: size = 4352.00 MiB (131072 cells,  16 layers,  4/1 seqs), K (q8_0): 2176.00 MiB, V (q8_0): 2176.00 MiB",
			"2026-05-14 22:14:32.517 | main: model loaded",
		},
		"level without time": {
			"I llama_kv_cache: size = 4352.00 MiB (131072 cells,  16 layers,  4/1 seqs), K (q8_0): 2176.00 MiB, V (q8_0): 2176.00 MiB",
			"I srv  llama_server: model loaded",
		},
	} {
		f, err := read(lines...)
		if err != nil || !slices.Equal(f.Ranks, ranks(0, 131072)) || !f.Ready {
			t.Errorf("%s: ranks %v ready %v err %v, want 131072 tokens, ready", name, f.Ranks, f.Ready, err)
		}
	}
	for name, line := range map[string]string{
		"a request body quoting a pool line": `0.13.750.219 I srv  log_server_r: request: {"prompt":"llama_kv_cache: size = 1.00 MiB (999999 cells, 1 layers, 1/1 seqs), K (f16): 1 MiB"}`,
		"a router's child":                   "[55496] 0.01.973.289 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 65536, kv_unified = 'true'",
	} {
		if ev, ok := enginelog.ParseLine(gram(t, "llamacpp"), line); ok {
			t.Errorf("%s: read as %+v", name, ev)
		}
	}
}
