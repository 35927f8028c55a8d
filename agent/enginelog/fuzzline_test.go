package enginelog_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"heft/agent/enginelog"
	"heft/shared/testutil"
)

// fixtureLines returns every line of the engine log fixtures, the real
// logs of testdata/engines/wild among them, as seeds.
func fixtureLines(f *testing.F) []string {
	root := testutil.RepoRoot(f)
	var out []string
	for _, pattern := range []string{"testdata/engines/*.log", "testdata/engines/wild/*.log", "testdata/logs/*.log"} {
		paths, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			out = append(out, strings.Split(string(b), "\n")...)
		}
	}
	return out
}

// FuzzParseLine feeds arbitrary text to every kind's line parser and to a
// Tracker: it must never panic, and ranks and pools are never negative.
func FuzzParseLine(f *testing.F) {
	for _, l := range fixtureLines(f) {
		f.Add(l)
	}
	f.Add("(EngineCore_DP1 pid=1) \x1b[32mINFO\x1b[0m 12-11 00:06:53 [k.py:1] GPU KV cache size: 1,2,3 tokens, Maximum concurrency for 9 tokens per request: 1e308x")
	f.Add("[2026-03-02 10:15:21.123 DP-1 TP1] max_total_num_tokens=-5, x")
	f.Add("47:(EngineCore pid=67) INFO 09-23 07:05:04 [kv_cache_utils.py:2395] CPU KV cache size: 21,760 tokens, Maximum concurrency for 2,048 tokens per request: 10.62x")
	f.Add("0.09.390.156 I srv    load_model: initializing, n_slots = 1048576, n_ctx_slot = 1099511627776, kv_unified = 'false'")
	f.Add("2026-05-14 22:14:31.035 | llama_kv_cache: size = 4352.00 MiB (131072 cells,  16 layers,  4/1 seqs), K (q8_0): 2176.00 MiB")
	f.Add("Feb 27 11:23:59 host ollama[26115]: llama_kv_cache: size = 1.00 MiB (1099511627776 cells,  1 layers,  65536/65536 seqs), K (f16): 1 MiB")
	f.Add("                    ollama-2  | llama_new_context_with_model: n_ctx      = 2048")
	f.Add("INFO 02-20 00:01:02 kv_cache_utils.py:522] # GPU blocks: 9223372036854775807")
	f.Add("llama_kv_cache_unified_iswa: creating non-SWA KV cache, size = 1099511627776 cells\n" +
		"llama_kv_cache: size = 1.00 MiB (1099511627776 cells,  1 layers, 65536/65536 seqs), K (f16): 1 MiB\n" +
		"llama_kv_cache: size = 1.00 MiB (1099511627776 cells,  1 layers, 2/2 seqs), K (f16): 1 MiB")
	f.Fuzz(func(t *testing.T, text string) {
		for _, kind := range []string{"vllm", "sglang", "llamacpp", "ollama"} {
			ev, ok := enginelog.ParseLine(gram(t, kind), text)
			if ok {
				// Any kind EventKind.String names: a bound on the last
				// constant went stale when EventActorRank came after
				// EventRouter (the wild logs' Ray DP lines found it).
				if ev.Kind.String() == "unknown" {
					t.Fatalf("%s: unknown kind %d", kind, ev.Kind)
				}
				if ev.DPRank < 0 || ev.DPRank > 1<<16 || ev.TPRank < -1 || ev.KVTokens < 0 || ev.Blocks < 0 || ev.MaxModelLen < 0 || ev.Concurrency < 0 || ev.Cells < 0 || ev.Streams < 0 {
					t.Fatalf("%s: bad event %+v", kind, ev)
				}
				if ev.Kind == enginelog.EventPool && ev.Format == "" {
					t.Fatalf("%s: pool without a format", kind)
				}
			}
			tr := enginelog.NewTracker(gram(t, kind))
			for _, line := range strings.Split(text, "\n") {
				tr.Feed(line)
			}
			facts, ok := tr.Facts()
			if ok != (len(facts.Ranks) > 0) {
				t.Fatalf("%s: ok=%v with %d ranks", kind, ok, len(facts.Ranks))
			}
			for i, r := range facts.Ranks {
				if r.DPRank < 0 || r.KVTokens < 0 || (i > 0 && r.DPRank <= facts.Ranks[i-1].DPRank) {
					t.Fatalf("%s: bad ranks %v", kind, facts.Ranks)
				}
			}
			if facts.Restarts < 0 || facts.Startups < facts.Restarts {
				t.Fatalf("%s: restarts %d startups %d", kind, facts.Restarts, facts.Startups)
			}
		}
	})
}
