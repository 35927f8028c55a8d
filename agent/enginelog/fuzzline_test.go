package enginelog_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"heft/agent/enginelog"
	"heft/shared/testutil"
)

// fixtureLines returns every line of the engine log fixtures, as seeds.
func fixtureLines(f *testing.F) []string {
	root := testutil.RepoRoot(f)
	var out []string
	for _, pattern := range []string{"testdata/engines/*.log", "testdata/logs/*.log"} {
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

// FuzzParseLine feeds arbitrary text to both kinds' line parser and to a
// Tracker: it must never panic, and ranks and pools are never negative.
func FuzzParseLine(f *testing.F) {
	for _, l := range fixtureLines(f) {
		f.Add(l)
	}
	f.Add("(EngineCore_DP1 pid=1) \x1b[32mINFO\x1b[0m 12-11 00:06:53 [k.py:1] GPU KV cache size: 1,2,3 tokens, Maximum concurrency for 9 tokens per request: 1e308x")
	f.Add("[2026-03-02 10:15:21.123 DP-1 TP1] max_total_num_tokens=-5, x")
	f.Fuzz(func(t *testing.T, text string) {
		for _, kind := range []string{"vllm", "sglang"} {
			ev, ok := enginelog.ParseLine(gram(t, kind), text)
			if ok {
				if ev.Kind < enginelog.EventPool || ev.Kind > enginelog.EventRouter {
					t.Fatalf("%s: unknown kind %d", kind, ev.Kind)
				}
				if ev.DPRank < 0 || ev.DPRank > 1<<16 || ev.TPRank < -1 || ev.KVTokens < 0 || ev.Blocks < 0 || ev.MaxModelLen < 0 || ev.Concurrency < 0 {
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
