package enginelog

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"heft/shared/wire"
)

func feed(t *testing.T, kind string, lines ...string) *Tracker {
	t.Helper()
	tr, err := NewTracker(kind)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		tr.Feed(l)
	}
	return tr
}

func mustFacts(t *testing.T, tr *Tracker) Facts {
	t.Helper()
	f, ok := tr.Facts()
	if !ok {
		t.Fatalf("no pools yet: %+v", f)
	}
	return f
}

func sgl(tokens, msg string) string { return "[2026-03-02 10:15:21" + tokens + "] " + msg }

func vll(prefix, msg string) string {
	return prefix + "INFO 12-11 09:14:37 [kv_cache_utils.py:1286] " + msg
}

func TestTrackerTPRanksDisagree(t *testing.T) {
	tr := feed(t, "sglang",
		sgl(" DP0 TP0", "KV Cache is allocated. #tokens: 30000, K size: 1 GB, V size: 1 GB"),
		sgl(" DP0 TP1", "KV Cache is allocated. #tokens: 30000, K size: 1 GB, V size: 1 GB"),
		sgl(" TP0 DP1", "KV Cache is allocated. #tokens: 29800, K size: 1 GB, V size: 1 GB"),
		sgl(" TP1 DP1", "KV Cache is allocated. #tokens: 29750, K size: 1 GB, V size: 1 GB"),
	)
	f := mustFacts(t, tr)
	if !slices.Equal(f.Ranks, ranks(0, 30000, 1, 29750)) || f.Format != FormatSGLangAlloc {
		t.Fatalf("ranks %v format %q", f.Ranks, f.Format)
	}
	if len(f.Notes) != 1 || !strings.Contains(f.Notes[0], "DP rank 1") || !strings.Contains(f.Notes[0], "29750 to 29800") {
		t.Errorf("notes = %q", f.Notes)
	}
}

func TestTrackerPrefersSchedulerFigure(t *testing.T) {
	tr := feed(t, "sglang",
		sgl(" DP0", "KV Cache is allocated. #tokens: 30016, K size: 1 GB, V size: 1 GB"),
		sgl(" DP1", "KV Cache is allocated. #tokens: 30016, K size: 1 GB, V size: 1 GB"),
	)
	if f := mustFacts(t, tr); f.Format != FormatSGLangAlloc || !slices.Equal(f.Ranks, ranks(0, 30016, 1, 30016)) {
		t.Fatalf("before max_total: %+v", f)
	}
	tr.Feed(sgl(" DP0", "max_total_num_tokens=30000, chunked_prefill_size=2048"))
	f := mustFacts(t, tr)
	// DP1 has not printed its scheduler line yet: each rank uses its best.
	if !slices.Equal(f.Ranks, ranks(0, 30000, 1, 30016)) || f.Format != FormatSGLangMaxTotal+","+FormatSGLangAlloc {
		t.Fatalf("mixed: ranks %v format %q", f.Ranks, f.Format)
	}
}

func TestTrackerRestarts(t *testing.T) {
	banner := "(APIServer pid=1) INFO 12-11 09:13:58 [api_server.py:1839] vLLM API server version 0.12.0"
	args := func(dp int) string {
		return fmt.Sprintf("(APIServer pid=1) INFO 12-11 09:13:58 [utils.py:253] non-default args: {'model': 'm', 'data_parallel_size': %d}", dp)
	}
	pool := func(proc string, n int) string { return vll(proc, fmt.Sprintf("GPU KV cache size: %d tokens", n)) }
	ready := "(APIServer pid=1) INFO:     Application startup complete."

	t.Run("banner after pools", func(t *testing.T) {
		tr := feed(t, "vllm", banner, args(2), pool("(EngineCore_DP0 pid=2) ", 100), pool("(EngineCore_DP1 pid=3) ", 90), ready)
		if f := mustFacts(t, tr); f.Restarts != 0 || f.Startups != 1 || !f.Ready || len(f.Ranks) != 2 {
			t.Fatalf("first start-up: %+v", f)
		}
		tr.Feed(banner)
		f, ok := tr.Facts()
		if ok || f.Ready || f.Restarts != 1 || f.Startups != 2 || f.LaunchArgs != nil {
			t.Fatalf("a new banner must drop the old start-up: ok=%v %+v", ok, f)
		}
		tr.Feed(args(1))
		tr.Feed(pool("(EngineCore pid=4) ", 70))
		f = mustFacts(t, tr)
		if !slices.Equal(f.Ranks, ranks(0, 70)) || f.Restarts != 1 || f.DPSize != 1 {
			t.Fatalf("second start-up: %+v", f)
		}
	})
	t.Run("args twice without pools", func(t *testing.T) {
		// The first start-up died before its pools; the second one's args
		// must not mix with the first one's.
		tr := feed(t, "vllm", args(2), args(1), pool("", 5))
		f := mustFacts(t, tr)
		if f.Restarts != 1 || f.DPSize != 1 {
			t.Fatalf("%+v", f)
		}
	})
	t.Run("engine init of a rank that has a pool", func(t *testing.T) {
		init := "(EngineCore_DP0 pid=9) INFO 12-11 09:14:14 [core.py:93] Initializing a V1 LLM engine (v0.12.0) with config: model='m'"
		tr := feed(t, "vllm", init, pool("(EngineCore_DP0 pid=9) ", 100), init)
		if f, ok := tr.Facts(); ok || f.Restarts != 1 {
			t.Fatalf("ok=%v %+v", ok, f)
		}
	})
	t.Run("engine init of another rank is the same start-up", func(t *testing.T) {
		tr := feed(t, "vllm",
			"(EngineCore_DP0 pid=9) INFO 12-11 09:14:14 [core.py:93] Initializing a V1 LLM engine (v0.12.0) with config: model='m'",
			pool("(EngineCore_DP0 pid=9) ", 100),
			"(EngineCore_DP1 pid=9) INFO 12-11 09:14:14 [core.py:93] Initializing a V1 LLM engine (v0.12.0) with config: model='m'",
			pool("(EngineCore_DP1 pid=9) ", 99))
		if f := mustFacts(t, tr); f.Restarts != 0 || len(f.Ranks) != 2 || f.Model != "m" || f.Version != "0.12.0" {
			t.Fatalf("%+v", f)
		}
	})
	t.Run("sglang server_args after ready", func(t *testing.T) {
		sa := sgl("", "server_args=ServerArgs(model_path='m', dp_size=2)")
		tr := feed(t, "sglang", sa, sgl("", "The server is fired up and ready to roll!"), sa)
		if f, ok := tr.Facts(); ok || f.Ready || f.Restarts != 1 {
			t.Fatalf("ok=%v %+v", ok, f)
		}
	})
}

func TestTrackerReset(t *testing.T) {
	pool := func(dp, n int) string {
		return sgl(fmt.Sprintf(" DP%d", dp), fmt.Sprintf("max_total_num_tokens=%d, chunked_prefill_size=1", n))
	}
	tr := feed(t, "sglang", sgl("", "server_args=ServerArgs(model_path='m', dp_size=2)"), pool(0, 100), pool(1, 90))
	tr.Reset()
	// Rotation: the new file holds only traffic, so the old pools stand,
	// flagged as read before the reset.
	tr.Feed(sgl(" DP0", "Decode batch. #running-req: 5, #token: 5735, token usage: 0.24"))
	f := mustFacts(t, tr)
	if !f.FromPreviousFile || !slices.Equal(f.Ranks, ranks(0, 100, 1, 90)) || f.Restarts != 0 {
		t.Fatalf("carried: %+v", f)
	}
	// The engine restarted: its first pool line replaces the carried facts.
	tr.Feed(pool(0, 80))
	f = mustFacts(t, tr)
	if f.FromPreviousFile || !slices.Equal(f.Ranks, ranks(0, 80)) || f.Restarts != 1 || f.LaunchArgs != nil {
		t.Fatalf("after new pool: %+v", f)
	}

	// Reset on an empty tracker carries nothing.
	empty := feed(t, "vllm")
	empty.Reset()
	empty.Feed(vll("", "GPU KV cache size: 5 tokens"))
	if f := mustFacts(t, empty); f.FromPreviousFile || f.Restarts != 0 || f.Startups != 1 {
		t.Fatalf("%+v", f)
	}
}

func TestTrackerBlocks(t *testing.T) {
	blocks := "INFO 02-18 08:50:24 executor_base.py:108] # cuda blocks: 100, # CPU blocks: 2"
	argsLine := func(bs string) string {
		return "INFO 02-18 08:50:20 [cli_args.py:1] non-default args: {'model': 'm', 'block_size': " + bs + "}"
	}
	tests := []struct {
		name  string
		lines []string
		want  int64
		note  string
	}{
		{"default", []string{blocks}, 1600, "default block size (no block_size"},
		{"from args", []string{argsLine("32"), blocks}, 3200, "block_size from the launch args"},
		{"None", []string{argsLine("None"), blocks}, 1600, "no block_size"},
		{"nonsense", []string{argsLine("-8"), blocks}, 1600, `block_size "-8"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustFacts(t, feed(t, "vllm", tc.lines...))
			if !slices.Equal(f.Ranks, ranks(0, tc.want)) || len(f.Notes) != 1 || !strings.Contains(f.Notes[0], tc.note) {
				t.Errorf("ranks %v notes %q, want %d and a note with %q", f.Ranks, f.Notes, tc.want, tc.note)
			}
		})
	}
	huge := mustFacts(t, feed(t, "vllm", argsLine("1024"), "INFO 02-18 08:50:24 [x.py:1] # cuda blocks: 9223372036854775807, # CPU blocks: 2", vll("(EngineCore_DP1 pid=1) ", "GPU KV cache size: 5 tokens")))
	if !slices.Equal(huge.Ranks, ranks(1, 5)) || !strings.Contains(strings.Join(huge.Notes, "|"), "overflow") {
		t.Errorf("overflowing blocks: %+v", huge)
	}
}

func TestTrackerNotesAndLimits(t *testing.T) {
	f := mustFacts(t, feed(t, "sglang",
		sgl("", "server_args=ServerArgs(model_path='m', dp_size=4)"),
		sgl(" DP0", "max_total_num_tokens=10, x=1")))
	if len(f.Notes) != 1 || !strings.Contains(f.Notes[0], "expected 4 data-parallel ranks (the launch args say dp_size=4) but 1 printed a KV pool; none from DP 1-3") {
		t.Errorf("notes %q", f.Notes)
	}

	tr := feed(t, "sglang")
	for r := range wire.MaxRanks + 10 {
		tr.Feed(sgl(fmt.Sprintf(" DP%d", r), "max_total_num_tokens=10, x=1"))
	}
	f = mustFacts(t, tr)
	if len(f.Ranks) != wire.MaxRanks || !strings.Contains(strings.Join(f.Notes, "|"), "10 pool lines of ranks beyond") {
		t.Errorf("ranks %d notes %q", len(f.Ranks), f.Notes)
	}
}

func TestTrackerFactsAreCopies(t *testing.T) {
	tr := feed(t, "vllm", "INFO 12-11 09:13:58 [utils.py:253] non-default args: {'model': 'm'}", vll("", "GPU KV cache size: 5 tokens"))
	f := mustFacts(t, tr)
	f.LaunchArgs["model"] = "changed"
	f.Ranks[0].KVTokens = 1
	if g := mustFacts(t, tr); g.LaunchArgs["model"] != "m" || g.Ranks[0].KVTokens != 5 {
		t.Fatalf("tracker state changed through returned facts: %+v", g)
	}
}

// Feed, Facts and Reset from several goroutines; run with -race.
func TestTrackerConcurrent(t *testing.T) {
	tr := feed(t, "sglang")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				tr.Feed(sgl(fmt.Sprintf(" DP%d", g), fmt.Sprintf("max_total_num_tokens=%d, x=1", 1000+i)))
				if i%50 == 0 {
					tr.Reset()
				}
				tr.Facts()
			}
		})
	}
	wg.Wait()
	f, ok := tr.Facts()
	if !ok || len(f.Ranks) == 0 {
		t.Fatalf("%+v", f)
	}
	for _, r := range f.Ranks {
		if r.KVTokens < 1000 || r.KVTokens > 1199 {
			t.Errorf("rank %+v out of range", r)
		}
	}
}
