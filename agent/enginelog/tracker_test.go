package enginelog_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/shared/wire"
)

func feed(t *testing.T, kind string, lines ...string) *enginelog.Tracker {
	t.Helper()
	tr := enginelog.NewTracker(gram(t, kind))
	for _, l := range lines {
		tr.Feed(l)
	}
	return tr
}

func mustFacts(t *testing.T, tr *enginelog.Tracker) enginelog.Facts {
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
	if !slices.Equal(f.Ranks, ranks(0, 30000, 1, 29750)) || f.Format != engine.FormatSGLangAlloc {
		t.Fatalf("ranks %v format %q", f.Ranks, f.Format)
	}
	if len(f.Notes) != 2 || !strings.Contains(f.Notes[0], "DP rank 1") || !strings.Contains(f.Notes[0], "29750 to 29800") ||
		f.RankCountUnknown == "" || f.Complete {
		t.Errorf("notes = %q", f.Notes)
	}
}

func TestTrackerPrefersSchedulerFigure(t *testing.T) {
	tr := feed(t, "sglang",
		sgl(" DP0", "KV Cache is allocated. #tokens: 30016, K size: 1 GB, V size: 1 GB"),
		sgl(" DP1", "KV Cache is allocated. #tokens: 30016, K size: 1 GB, V size: 1 GB"),
	)
	if f := mustFacts(t, tr); f.Format != engine.FormatSGLangAlloc || !slices.Equal(f.Ranks, ranks(0, 30016, 1, 30016)) {
		t.Fatalf("before max_total: %+v", f)
	}
	tr.Feed(sgl(" DP0", "max_total_num_tokens=30000, chunked_prefill_size=2048"))
	f := mustFacts(t, tr)
	// DP1 has not printed its scheduler line yet: each rank uses its best.
	if !slices.Equal(f.Ranks, ranks(0, 30000, 1, 30016)) || f.Format != engine.FormatSGLangMaxTotal+","+engine.FormatSGLangAlloc {
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
		if ok || f.Ready || f.Restarts != 1 || f.Startups != 2 || f.LaunchArgs != nil || !f.BannerOnly {
			t.Fatalf("a new banner must drop the old start-up, and show it has read the banner only: ok=%v %+v", ok, f)
		}
		tr.Feed(args(1))
		if f, _ := tr.Facts(); f.BannerOnly {
			t.Fatalf("launch args read: %+v", f)
		}
		tr.Feed(pool("(EngineCore pid=4) ", 70))
		f = mustFacts(t, tr)
		if !slices.Equal(f.Ranks, ranks(0, 70)) || f.Restarts != 1 || f.DPSize != 1 || f.BannerOnly {
			t.Fatalf("second start-up: %+v", f)
		}
	})
	t.Run("banner only", func(t *testing.T) {
		// Whatever follows a banner ends "banner only": an engine that
		// prints no launch args still shows its engine core or a pool.
		init := "(EngineCore pid=9) INFO 12-11 09:14:14 [core.py:93] Initializing a V1 LLM engine (v0.12.0) with config: model='m'"
		for _, next := range []string{init, pool("", 5), ready} {
			tr := feed(t, "vllm", banner)
			if f, _ := tr.Facts(); !f.BannerOnly {
				t.Fatalf("banner: %+v", f)
			}
			tr.Feed(next)
			if f, _ := tr.Facts(); f.BannerOnly {
				t.Fatalf("banner, then %q: %+v", next, f)
			}
		}
		// A rotated file carries the old start-up's facts: not a banner.
		tr := feed(t, "vllm", banner, args(1), pool("", 5))
		tr.Reset()
		if f, _ := tr.Facts(); f.BannerOnly || !f.FromPreviousFile {
			t.Fatalf("carried: %+v", f)
		}
		if f, _ := feed(t, "vllm", args(1)).Facts(); f.BannerOnly {
			t.Fatalf("args without a banner: %+v", f)
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

// Feed, enginelog.Facts and Reset from several goroutines; run with -race.
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

// Each naming vLLM has given a rank's process reads as that rank.
func TestRankNamings(t *testing.T) {
	pool := func(prefix string, n int) string { return vll(prefix, fmt.Sprintf("GPU KV cache size: %d tokens", n)) }
	args := "(APIServer pid=1) INFO 12-11 09:13:58 [utils.py:253] non-default args: {'model': 'm', 'data_parallel_size': 2}"
	one := "(APIServer pid=1) INFO 09-03 00:35:55 [utils.py:326] non-default args: {'model': 'm', 'tensor_parallel_size': 2}"
	tests := []struct {
		name  string
		lines []string
		want  []wire.Rank
		known bool
	}{
		{"EngineCore_<n> of v0.8.3 to v0.10.1", []string{args, pool("(EngineCore_0 pid=5) ", 9000), pool("(EngineCore_1 pid=6) ", 8000)}, ranks(0, 9000, 1, 8000), true},
		{"EngineCore_1 alone is rank 1", []string{pool("(EngineCore_1 pid=6) ", 8000)}, ranks(1, 8000), false},
		// v0.10.1 names a single engine EngineCore_0 too (two whole logs of
		// v0.10.1.1, testdata/engines/wild): launch args without
		// data_parallel_size say it is the only rank.
		{"EngineCore_0 with args lacking data_parallel_size is one engine", []string{one, pool("(EngineCore_0 pid=5) ", 9000)}, ranks(0, 9000), true},
		{"EngineCore_0 without args may be DP rank 0", []string{pool("(EngineCore_0 pid=5) ", 9000)}, ranks(0, 9000), false},
		{"EngineCore_1 contradicts args lacking data_parallel_size", []string{one, pool("(EngineCore_1 pid=6) ", 8000)}, ranks(1, 8000), false},
		{"Ray nests its prefix before vLLM's", []string{args, pool("(EngineCore_DP1 pid=7) (RayWorkerWrapper pid=9, ip=10.0.0.2) ", 7000), pool("(EngineCore_DP0 pid=6) ", 7100)}, ranks(0, 7100, 1, 7000), true},
		// v0.10.1.1 names a single engine EngineCore_0 too (dennislee22/vLLM-benchmarking's logs):
		// launch args without data_parallel_size say it is the only rank.
		{"EngineCore_0 with args lacking data_parallel_size is one engine", []string{one, pool("(EngineCore_0 pid=5) ", 9000)}, ranks(0, 9000), true},
		{"EngineCore_0 without args may be DP rank 0", []string{pool("(EngineCore_0 pid=5) ", 9000)}, ranks(0, 9000), false},
		{"EngineCore_1 contradicts args lacking data_parallel_size", []string{one, pool("(EngineCore_1 pid=6) ", 8000)}, ranks(1, 8000), false},
		// --data-parallel-backend=ray (kuberay#4366): the engine core actors' names carry no rank;
		// each says its DP rank in parallel_state's line, and its pool belongs to that rank.
		{"DPEngineCoreActor takes the DP rank it was assigned", []string{args,
			vll("(APIServer pid=1) (DPEngineCoreActor pid=7, ip=10.0.0.2) ", "rank 1 in world size 2 is assigned as DP rank 1, PP rank 0, TP rank 0, EP rank 1"),
			vll("(APIServer pid=1) (DPEngineCoreActor pid=6) ", "rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0"),
			pool("(APIServer pid=1) (DPEngineCoreActor pid=7, ip=10.0.0.2) ", 938544), pool("(APIServer pid=1) (DPEngineCoreActor pid=6) ", 938000)}, ranks(0, 938000, 1, 938544), true},
		{"VllmWorker rank is a TP rank", []string{args, pool("(EngineCore_0 pid=5) (VllmWorker rank=1 pid=8) ", 9000), pool("(EngineCore_1 pid=6) ", 9000)}, ranks(0, 9000, 1, 9000), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustFacts(t, feed(t, "vllm", tc.lines...))
			if !slices.Equal(f.Ranks, tc.want) || (f.RankCountUnknown == "") != tc.known {
				t.Fatalf("ranks %v unknown %q", f.Ranks, f.RankCountUnknown)
			}
			if !tc.known && f.Complete {
				t.Fatal("complete without knowing the count")
			}
		})
	}
}

// With --enable-dp-attention only DP0 prints max_total_num_tokens; SGLang
// sizes every attention-DP rank's pool from one minimum, so a DP4 log
// whose other ranks print nothing still reads as four equal ranks.
func TestDPAttentionSharedPool(t *testing.T) {
	args := sgl("", "server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', tp_size=4, dp_size=4, enable_dp_attention=True, port=30000)")
	f := mustFacts(t, feed(t, "sglang", args, sgl(" DP0 TP0", "max_total_num_tokens=161488, chunked_prefill_size=4096")))
	if !slices.Equal(f.Ranks, ranks(0, 161488, 1, 161488, 2, 161488, 3, 161488)) || !f.Complete {
		t.Fatalf("%+v", f)
	}
	// Without the flag the missing ranks stay missing.
	f = mustFacts(t, feed(t, "sglang", strings.Replace(args, "enable_dp_attention=True", "enable_dp_attention=False", 1),
		sgl(" DP0 TP0", "max_total_num_tokens=161488, chunked_prefill_size=4096")))
	if len(f.Ranks) != 1 || f.Complete || !slices.Equal(f.MissingRanks, []int{1, 2, 3}) {
		t.Fatalf("%+v", f)
	}
	// Ranks that printed different pools contradict the shared sizing.
	f = mustFacts(t, feed(t, "sglang", args, sgl(" DP0 TP0", "max_total_num_tokens=161488, c=1"), sgl(" DP1 TP1", "max_total_num_tokens=150000, c=1")))
	if len(f.Ranks) != 2 || f.Complete {
		t.Fatalf("%+v", f)
	}
}

// Router workers and two servers in one log are separate servers: never
// one rank, and no completeness.
func TestSeveralServers(t *testing.T) {
	srv := func(port int) string {
		return sgl("", fmt.Sprintf("server_args=ServerArgs(model_path='m', tp_size=1, dp_size=1, port=%d)", port))
	}
	pool := func(n int) string { return sgl(" TP0", fmt.Sprintf("max_total_num_tokens=%d, c=1", n)) }
	for name, lines := range map[string][]string{
		"two ports":     {srv(31000), srv(31001), pool(9000), pool(7000)},
		"router --dp 2": {"python -m sglang_router.launch_server --model-path m --dp 2", srv(31000), pool(9000), pool(7000)},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := enginelog.Read(gram(t, "sglang"), strings.NewReader(strings.Join(lines, "\n")))
			if !errors.Is(err, enginelog.ErrSeveralServers) || len(f.Ranks) != 0 || f.Servers != 2 || f.Complete {
				t.Fatalf("err %v facts %+v", err, f)
			}
		})
	}
	// A restart serves on the same port: the second start-up wins.
	f := mustFacts(t, feed(t, "sglang", srv(31000), pool(9000), srv(31000), pool(8000)))
	if f.Restarts != 1 || !slices.Equal(f.Ranks, ranks(0, 8000)) {
		t.Fatalf("%+v", f)
	}
	// A log of endless ports (corrupt, or hostile) is several servers; the
	// tracker remembers a bounded number of them, where it kept every one
	// and scanned them all at each line.
	lines := make([]string, 5000)
	for i := range lines {
		lines[i] = srv(10000 + i)
	}
	f, err := enginelog.Read(gram(t, "sglang"), strings.NewReader(strings.Join(lines, "\n")))
	if !errors.Is(err, enginelog.ErrSeveralServers) || f.Servers != 64 {
		t.Fatalf("5,000 ports: err %v, servers %d; want several, 64 remembered", err, f.Servers)
	}
}

// argparse reads "--dp 4" as --dp-size 4; "--dp $N" hides the size.
func TestDPFlagForms(t *testing.T) {
	pool := sgl(" DP0", "max_total_num_tokens=9, c=1")
	f := mustFacts(t, feed(t, "sglang", "python -m sglang.launch_server --model-path m --dp 4", pool))
	if f.ExpectedRanks != 4 || f.RankCountUnknown != "" {
		t.Fatalf("%+v", f)
	}
	f = mustFacts(t, feed(t, "sglang", "python -m sglang.launch_server --model-path m --dp $DP", pool))
	if f.RankCountUnknown == "" || f.Complete {
		t.Fatalf("%+v", f)
	}
}

// Two vLLM servers writing to one log before either is ready (their
// launch args name different ports) are two servers, not a restart: no
// pools, rather than one server's read as the other's.
func TestTwoVLLMServersInterleaved(t *testing.T) {
	args := func(port int) string {
		return fmt.Sprintf("(APIServer pid=%d) INFO 12-11 09:13:58 [utils.py:253] non-default args: {'model': 'm', 'port': %d}", port, port)
	}
	f, err := enginelog.Read(gram(t, "vllm"), strings.NewReader(strings.Join([]string{args(8000), args(8001),
		vll("(EngineCore pid=5) ", "GPU KV cache size: 9,000 tokens"), vll("(EngineCore pid=6) ", "GPU KV cache size: 7,000 tokens")}, "\n")))
	if !errors.Is(err, enginelog.ErrSeveralServers) || f.Servers != 2 || len(f.Ranks) != 0 {
		t.Fatalf("err %v facts %+v", err, f)
	}
}
